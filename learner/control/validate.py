"""What a rollout must be before the learner counts it as anything but ``invalid``.

    guard = Guard(group_size=8, max_episode_tokens=1024, vocab_size=vocab_size(model_dir))
    guard.issue(actor_id, tickets)           # every Grant the learner sends
    reason = guard.claim(r)                  # None: a ticket of r.actor_id's, still open
    reason = guard.content(r)                # None: arrays and numbers the trainer can take
    guard.reject(reason, r)                  # counted per reason (metrics, summary.json)

``protocol`` decoding already guarantees types, bounded sizes and matching array lengths; this
module checks what only the learner knows: which tickets it issued to whom, the vocabulary, the
token budget, and values that would turn a training step into NaNs or an index error. A peer
that fails a check gets an ``invalid`` Ack and its rollout is never trained; nothing here raises.

Tickets stay open until answered. A ticket re-queued after its actor was presumed dead keeps
that actor as a holder, so its late rollout still counts (the first answer wins, a second copy
is a duplicate). The open tickets are part of the learner's checkpoint, so after a resume the
rollouts of tickets issued before it are still admitted.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import msgspec
import numpy as np
import structlog

from agentgym.protocol import Episode, Rollout, Ticket
from agentgym.protocol.arrays import F32, I32, U8, unpack

log = structlog.get_logger(__name__)


def vocab_size(model_dir: Path) -> int | None:
    """The embedding rows of an HF model directory (config.json's vocab_size), None if unknown."""
    try:
        cfg = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    for c in (cfg, cfg.get("text_config") or {}):
        if isinstance(c.get("vocab_size"), int) and c["vocab_size"] > 0:
            return int(c["vocab_size"])
    return None


class Guard:
    def __init__(self, *, group_size: int, max_episode_tokens: int, vocab_size: int | None) -> None:
        self.group_size = group_size
        self.max_episode_tokens = max_episode_tokens
        self.vocab_size = vocab_size
        self.open: dict[str, tuple[Ticket, set[str]]] = {}
        """Tickets issued and not yet answered -> (ticket, actors it was issued to)."""
        self.invalid: Counter[str] = Counter()
        """Rollouts answered ``invalid``, per reason."""
        self.dropped: Counter[str] = Counter()
        """Control messages ignored before any rollout logic (wrong kind, impostor, unknown actor)."""

    # ------------------------------------------------------------------ tickets
    def issue(self, actor_id: str, tickets: list[Ticket]) -> None:
        for t in tickets:
            self.open.setdefault(t.group_id, (t, set()))[1].add(actor_id)

    def claim(self, r: Rollout) -> str | None:
        """None if ``r`` answers an open ticket issued to ``r.actor_id`` (the ticket is then closed:
        call only for a group id the learner has not seen)."""
        entry = self.open.get(r.group_id)
        if entry is None:
            return "unknown_ticket"
        ticket, holders = entry
        if r.actor_id not in holders:
            return "not_this_actors_ticket"
        if r.env != ticket.env:
            return "env_mismatch"
        if r.task_id != ticket.task_id:
            return "task_mismatch"
        del self.open[r.group_id]
        return None

    # ------------------------------------------------------------------ content
    def content(self, r: Rollout, version: int | None = None) -> str | None:
        """None if every episode's arrays are consistent, finite and in range (agent tokens'
        versions within [0, ``version``], the learner's: no weights it never made)."""
        if len(r.episodes) != self.group_size:
            return "group_size"
        for e in r.episodes:
            reason = self._episode(e, version)
            if reason is not None:
                return reason
        return None

    def _episode(self, e: Episode, version: int | None) -> str | None:
        ids = unpack(e.token_ids, I32)
        n = ids.size
        if n > self.max_episode_tokens:
            return "too_many_tokens"
        if n and (ids.min() < 0 or (self.vocab_size is not None and ids.max() >= self.vocab_size)):
            return "token_out_of_vocab"
        mask = unpack(e.loss_mask, U8)
        if n and mask.max() > 1:
            return "loss_mask_not_0_1"
        agent = mask == 1
        vers = unpack(e.versions, I32)
        if np.any(vers[~agent] != -1) or np.any(vers[agent] < 0):
            return "versions_inconsistent_with_mask"
        if version is not None and agent.any() and int(vers[agent].max()) > version:
            # Weights the learner never made (after a resume from an earlier checkpoint the
            # actors' newer weights are gone too: what they played then is not trainable either).
            return "version_out_of_range"
        lp = unpack(e.logprobs, F32)
        if not np.all(np.isfinite(lp)) or np.any(lp[agent] > 1e-5):  # log-probabilities: <= 0 (+ rounding)
            return "logprob_not_finite_or_positive"
        rewards = unpack(e.turn_rewards, F32)
        if not np.isfinite(e.reward) or not np.all(np.isfinite(rewards)):
            return "reward_not_finite"
        ends = unpack(e.turn_ends, I32)
        if ends.size and (ends[0] < 1 or ends[-1] > n or np.any(np.diff(ends) <= 0)):
            return "turn_ends_out_of_order_or_range"
        if e.segment_ends:
            seg = unpack(e.segment_ends, I32)
            if seg[0] < 1 or seg[-1] != n or np.any(np.diff(seg) <= 0):
                return "segment_ends_out_of_order_or_range"
        return None

    # ------------------------------------------------------------------ accounting
    def reject(self, reason: str, r: Rollout) -> None:
        self.invalid[reason] += 1
        if self.invalid[reason] <= 10 or self.invalid[reason] % 1000 == 0:  # a flood is not a log flood
            log.warning(
                "rollout_invalid",
                reason=reason,
                count=self.invalid[reason],
                group=r.group_id,
                actor_id=r.actor_id,
                env=r.env,
                task=r.task_id,
            )

    def drop(self, reason: str, **fields: object) -> None:
        self.dropped[reason] += 1
        if self.dropped[reason] <= 10 or self.dropped[reason] % 1000 == 0:
            log.warning("message_dropped", reason=reason, count=self.dropped[reason], **fields)

    def metrics(self) -> dict[str, int]:
        return {
            **{f"invalid/{k}": v for k, v in self.invalid.items()},
            **{f"dropped/{k}": v for k, v in self.dropped.items()},
        }

    def state(self) -> list[dict[str, object]]:
        """The open tickets, for the checkpoint."""
        return [{"ticket": msgspec.to_builtins(t), "holders": sorted(h)} for t, h in self.open.values()]

    def restore(self, state: list[dict[str, object]]) -> None:
        for item in state:
            t = msgspec.convert(item["ticket"], Ticket)
            self.open[t.group_id] = (t, set(item["holders"]))  # type: ignore[call-overload]  # a list of ids, as state() wrote it
