"""agentgym.protocol: the messages that cross a process boundary, their msgpack frames and checks.

Plain data, no I/O and no event loop. Import messages from here:
``from agentgym.protocol import Hello, encode, decode``.
"""

from agentgym.protocol.errors import ProtocolError, VersionMismatch
from agentgym.protocol.messages import (
    MESSAGE_TYPES,
    Ack,
    AckStatus,
    CriticSpec,
    Episode,
    Grant,
    Handover,
    Heartbeat,
    Hello,
    Leave,
    Message,
    PartialEpisode,
    Reject,
    Rollout,
    RolloutSpec,
    Shutdown,
    TensorMeta,
    Ticket,
    WeightChunk,
    WeightGone,
    WeightRequest,
    WeightsReady,
    Welcome,
)
from agentgym.protocol.wire import PROTOCOL_VERSION, decode, encode, encode_into, max_frame_bytes, peek_kind

__all__ = [
    "MESSAGE_TYPES",
    "PROTOCOL_VERSION",
    "Ack",
    "AckStatus",
    "Episode",
    "Grant",
    "Heartbeat",
    "Hello",
    "Leave",
    "Message",
    "ProtocolError",
    "Reject",
    "Rollout",
    "RolloutSpec",
    "CriticSpec",
    "Shutdown",
    "TensorMeta",
    "Ticket",
    "VersionMismatch",
    "WeightChunk",
    "WeightGone",
    "WeightRequest",
    "WeightsReady",
    "Welcome",
    "decode",
    "encode",
    "encode_into",
    "max_frame_bytes",
    "peek_kind",
    "Handover",
    "PartialEpisode",
]
