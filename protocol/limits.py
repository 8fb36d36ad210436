"""How large a frame can honestly be, from the run's limits: the caps both sides set on sockets.

    group_bytes(group_size=8, max_episode_tokens=4096)       # one group's rollout, at most
    actor_control_frame(group_size, max_episode_tokens, max_groups)  # the actor's control DEALER
    weights_frame(ready.total_bytes, ready.tensors)           # the actor's weights DEALER

ZeroMQ refuses a frame over a socket's ``MAXMSGSIZE`` before reading it (the connection is
dropped and made again), so a peer cannot make the receiver allocate more than the cap. The
learner's caps are learner/control/bounds.py (built on these figures); the actor's are here:

- control (from the learner): the largest message is a Grant; every ticket in it may carry a
  hand-over (at most a group: the finished and partial episodes of a leaving actor), and an
  actor holds at most ``actor.max_groups`` tickets (a re-Hello gets them all at once). Welcome,
  WeightsReady and the rest are small next to ``MARGIN``.
- weights (from the learner or a relay): a chunk's data frame holds at most the version's
  ``total_bytes`` (WeightsReady, the manifest), its header one ``TensorMeta`` per tensor.
- agent endpoint (HTTP, from the user's agent program): a chat completion request holds the
  conversation so far, which must fit the episode's ``max_episode_tokens`` tokens (a longer one
  is refused as a token_limit anyway), at ``AGENT_TEXT_BYTES`` a token, plus ``MARGIN`` for the
  tools and the sampling fields.

A weight relay's (agentgym/cluster/relay.py):

- downstream (from actors or child relays): only WeightRequests, ``REQUEST_FRAME``;
- upstream (from the learner or a parent relay): chunks of at most ``learner.weight_chunk_mib``,
  ``chunk_frame``.

Queues, in messages (ZeroMQ's high-water marks count messages, not bytes): a weights port (the
learner's, a relay's) holds at most ``WEIGHT_REQUESTS_QUEUED`` unread requests per peer and
queues at most ``WEIGHT_REPLIES_QUEUED`` replies for it; an actor's weights link holds at most
``WEIGHT_CHUNKS_QUEUED`` unread chunks, a relay's upstream link ``WEIGHT_REPLIES_QUEUED``. An honest peer has a few dozen
requests in flight, so only a peer that asks and does not read meets these marks.
"""

from __future__ import annotations

KiB, MiB = 1024, 1024 * 1024
TOKEN_BYTES = 13 + 8 + 8 + 4 + 64
"""Per token: ids, logprobs, versions (4 each) and the loss mask (1); per turn (a turn is at
least a token) its end and reward (8), a critique span (8) and a segment end (4); and 64 bytes
of action text, what a token decodes to and more."""
EPISODE_FIXED = 320 * KiB
"""Per episode: the failure text (64 Ki characters, up to 4 bytes each) and the keys."""
MARGIN = 1 * MiB
REQUEST_FRAME = 4 * KiB
"""A WeightRequest's frames (a few dozen bytes): what a weights port (the learner's, a relay's) takes."""
DEFAULT_CHUNK_MIB = 16
"""``learner.weight_chunk_mib``'s default: a weight chunk's data frame, at most."""
AGENT_TEXT_BYTES = 6 * 64
"""Per token of an agent's request: 64 bytes of text (as in ``TOKEN_BYTES``), each byte at most
6 in JSON (``\\u00XX``)."""
WEIGHTS_IN_FLIGHT = 64
"""The most requests an honest peer has in flight on a weights port: a relay's ``max_in_flight``
(an actor's fetch window is 4)."""
WEIGHT_REPLIES_QUEUED = 4 * WEIGHTS_IN_FLIGHT
"""Replies a weights port queues for one peer (its ``SNDHWM``); past it, a reply is dropped and
logged. Each queued reply references a version's chunk (zero-copy): the mark also bounds what a
peer that never reads can keep alive."""
WEIGHT_CHUNKS_QUEUED = 16
"""Unread chunks an actor's weights link holds (its ``RCVHWM``): 4 times its fetch window. A
source that sends what was not asked for waits in TCP past that, and is left for the next."""
WEIGHT_REQUESTS_QUEUED = 1024
"""Unread requests a weights port holds per peer (its ``RCVHWM``): 4 MiB of ``REQUEST_FRAME``s."""
TENSOR_META = 512
"""Per tensor of a weight chunk's header: its name (up to 256 bytes), dtype, shape, offsets."""


def group_bytes(group_size: int, max_episode_tokens: int) -> int:
    """The largest encoded group of ``group_size`` episodes at the rollout limits."""
    return group_size * (max_episode_tokens * TOKEN_BYTES + EPISODE_FIXED)


def actor_control_frame(group_size: int, max_episode_tokens: int, max_groups: int) -> int:
    """Cap on a frame the actor's control socket takes from the learner (a Grant of ``max_groups``
    tickets, each with a hand-over of a group)."""
    return max(1, max_groups) * group_bytes(group_size, max_episode_tokens) + MARGIN


def weights_frame(total_bytes: int, tensors: int) -> int:
    """Cap on a frame the actor's weights socket takes (a chunk of a version of ``total_bytes``)."""
    return total_bytes + max(tensors, 1) * TENSOR_META + MARGIN


def chunk_frame(chunk_mib: int = DEFAULT_CHUNK_MIB) -> int:
    """Cap on a frame of a weights stream whose chunks are at most ``chunk_mib`` MiB (a relay's
    upstream): the data frame, or a header of up to ``MARGIN / TENSOR_META`` tensors more."""
    return chunk_mib * MiB + MARGIN


def agent_request_bytes(max_episode_tokens: int) -> int:
    """Cap on an HTTP request body the actor's agent endpoint reads (a conversation of at most
    ``max_episode_tokens`` tokens)."""
    return max_episode_tokens * AGENT_TEXT_BYTES + MARGIN
