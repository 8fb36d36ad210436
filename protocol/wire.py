"""Frames on the wire: a 4-byte header, a msgpack body, and optional raw data frames.

    frame 0: b"AG" + protocol version (u8) + message kind (u8)
    frame 1: the message as msgpack (msgspec struct, map encoding: any msgpack reader can read it)
    frame 2…: raw bytes that belong to the message (weight tensors), sent zero-copy

``decode`` never executes code from the bytes (no pickle), checks the version before touching
the body, refuses frames larger than the limit for their kind, and raises ``ProtocolError``
with the message type and the path of the bad field.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import msgspec

from agentgym.protocol.errors import ProtocolError, VersionMismatch
from agentgym.protocol.messages import MESSAGE_TYPES, Grant, Leave, Message, Rollout, WeightChunk

PROTOCOL_VERSION: Final = 2
MAGIC: Final = b"AG"
HEADER_LEN: Final = 4

KiB, MiB = 1024, 1024 * 1024
DEFAULT_MAX_BODY: Final = 1 * MiB
MAX_BODY: Final[dict[type[Message], int]] = {Rollout: 256 * MiB, Leave: 256 * MiB, Grant: 256 * MiB}
"""Leave and Grant carry hand-overs (a group's tokens so far) as a Rollout carries episodes."""
MAX_WEIGHT_DATA: Final = 1024 * MiB
"""Largest raw data frame of a weight chunk (chunks are built well under this)."""

_BY_KIND: Final = {cls.KIND: cls for cls in MESSAGE_TYPES}
_DECODERS: Final = {cls: msgspec.msgpack.Decoder(cls) for cls in MESSAGE_TYPES}
_ENCODER: Final = msgspec.msgpack.Encoder()
assert len(_BY_KIND) == len(MESSAGE_TYPES), "two message types share a KIND"


def header(kind: int) -> bytes:
    return MAGIC + bytes((PROTOCOL_VERSION, kind))


_HEADERS: Final = {kind: header(kind) for kind in _BY_KIND}


def encode(msg: Message, *data: bytes | memoryview) -> list[bytes | memoryview]:
    """Frames for ``msg``; ``data`` frames ride along (only WeightChunk has one)."""
    return [_HEADERS[msg.KIND], _ENCODER.encode(msg), *data]


def encode_into(msg: Message, buffer: bytearray) -> list[bytes | bytearray]:
    """``encode`` into ``buffer`` (resized to fit): frames [header, buffer]. A sender that reuses
    one buffer, and lets ZeroMQ copy it before the next message, allocates nothing per message."""
    _ENCODER.encode_into(msg, buffer)
    return [_HEADERS[msg.KIND], buffer]


def max_frame_bytes() -> int:
    """Largest frame any message may have: the ZeroMQ MAXMSGSIZE to set on sockets."""
    return max(MAX_WEIGHT_DATA, *MAX_BODY.values())


def peek_kind(frames: Sequence[bytes | memoryview]) -> type[Message]:
    """Check the header (magic, version, kind) and return the message type it announces."""
    if len(frames) < 2:
        raise ProtocolError(f"expected a header and a body frame, got {len(frames)} frame(s)")
    if len(frames[0]) != HEADER_LEN:  # before any copy: a peer's first frame may be large
        raise ProtocolError(f"frame 0 is not an agentgym header ({len(frames[0])} bytes, not {HEADER_LEN})")
    head = bytes(frames[0])
    if head[:2] != MAGIC:
        raise ProtocolError(f"frame 0 is not an agentgym header (got {head[:8]!r})")
    if head[2] != PROTOCOL_VERSION:
        raise VersionMismatch(head[2], PROTOCOL_VERSION)
    cls = _BY_KIND.get(head[3])
    if cls is None:
        raise ProtocolError(f"unknown message kind {head[3]} in header")
    return cls


def decode(frames: Sequence[bytes | memoryview]) -> tuple[Message, list[memoryview]]:
    """Decode one message; returns it with its raw data frames (empty for most kinds)."""
    cls = peek_kind(frames)
    body = frames[1]
    limit = MAX_BODY.get(cls, DEFAULT_MAX_BODY)
    if len(body) > limit:
        raise ProtocolError(f"{cls.__name__}: body of {len(body)} bytes exceeds the {limit}-byte limit")
    data = [memoryview(f) for f in frames[2:]]
    expected = 1 if cls is WeightChunk else 0
    if len(data) != expected:
        raise ProtocolError(f"{cls.__name__}: expected {expected} data frame(s), got {len(data)}")
    try:
        msg = _DECODERS[cls].decode(body)
    except msgspec.ValidationError as exc:
        raise ProtocolError(f"{cls.__name__}: {exc}") from None
    except (msgspec.DecodeError, ValueError) as exc:
        # ValueError: e.g. UnicodeDecodeError from a string that is not UTF-8, which msgspec
        # does not wrap; uncaught it would end the learner's I/O thread.
        raise ProtocolError(f"{cls.__name__}: malformed msgpack body: {exc}") from None
    if isinstance(msg, WeightChunk):
        if len(data[0]) != msg.nbytes or len(data[0]) > MAX_WEIGHT_DATA:
            raise ProtocolError(f"WeightChunk: data frame has {len(data[0])} bytes, header says {msg.nbytes}")
    return msg, data
