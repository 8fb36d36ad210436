"""What the learner's sockets accept, derived from the run's limits instead of one cap for all.

    caps = SocketBounds.from_config(cfg)
    open_hub(bind, max_msg_bytes=caps.control_frame, weights_max_bytes=caps.weights_frame,
             inbox_size=caps.inbox_messages)

ZeroMQ refuses a frame over a socket's ``MAXMSGSIZE`` before reading it (the peer's connection
is dropped), and holds at most ``RCVHWM`` unread messages per peer. With one cap of 1 GiB and
10,000 messages, one admitted peer could make the learner hold terabytes. Here:

- control socket: the largest message an actor sends is a group's rollout, or a Leave carrying
  the hand-overs of every ticket it may hold. A group is ``group_size`` episodes; an episode is
  ``max_episode_tokens`` tokens at ``TOKEN_BYTES`` each (its packed arrays, 13 bytes, with room
  for the per-turn arrays and the text of actions an episode's tokens decode to) plus
  ``EPISODE_FIXED`` (the failure text, up to 64 Ki characters, and msgpack's keys). A Leave holds
  at most ``pipeline`` groups (the tickets the staleness rule admits, all of which one actor
  could hold). Plus ``MARGIN``.
- weights socket: only WeightRequests arrive (a few dozen bytes): ``WEIGHTS_FRAME``.
- receive queue: ``RCVHWM`` is a message count; it is set so that that many groups of the
  largest size fit ``learner.inbox_mib`` (at least ``MIN_INBOX`` messages): the bytes ZeroMQ
  holds unread per actor are bounded by the budget, one Leave (once per actor life) aside.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from agentgym.learner.control.staleness import StalenessRule

# The per-token and per-episode figures are the actor's too (its caps): one definition.
from agentgym.protocol.limits import EPISODE_FIXED, MARGIN, REQUEST_FRAME, TOKEN_BYTES, KiB, MiB, group_bytes

if TYPE_CHECKING:
    from agentgym.config import Config

__all__ = ["EPISODE_FIXED", "MARGIN", "TOKEN_BYTES", "KiB", "MiB", "MIN_INBOX", "WEIGHTS_FRAME", "SocketBounds"]
WEIGHTS_FRAME = REQUEST_FRAME
MIN_INBOX = 16


@dataclass(frozen=True)
class SocketBounds:
    group_bytes: int
    control_frame: int
    weights_frame: int
    inbox_messages: int

    @classmethod
    def build(cls, *, group_size: int, max_episode_tokens: int, pipeline: int, inbox_mib: int) -> SocketBounds:
        group = group_bytes(group_size, max_episode_tokens)
        control = max(group, group * max(1, pipeline)) + MARGIN
        return cls(group, control, WEIGHTS_FRAME, max(MIN_INBOX, inbox_mib * MiB // group))

    @classmethod
    def from_config(cls, cfg: Config) -> SocketBounds:
        rc, lc = cfg.rollout, cfg.learner
        pipeline = StalenessRule.from_config(cfg).pipeline  # the rule owns the bound B·(K+1)
        return cls.build(
            group_size=rc.group_size,
            max_episode_tokens=rc.max_episode_tokens,
            pipeline=pipeline,
            inbox_mib=lc.inbox_mib,
        )
