"""Messages between an env pool and one env worker subprocess, and their pipe framing.

The pool (``agentgym.envpool.pool``) starts ``python -m agentgym.envpool.worker`` and talks to it
over the worker's stdin/stdout, one request and then one reply at a time:

    pool -> worker: Open(version, env, target, kwargs)   -> Ready(version, pid) | Failure
                    Reset(task_id)                       -> Observation (with instructions) | Failure
                    Step(action)                         -> Observation | Failure
                    Expert()                             -> Action | Failure
                    Close()                              -> (the worker exits)

A frame is a 4-byte little-endian unsigned body length followed by the body, one msgspec struct
encoded as a msgpack map tagged with its class (``{"type": "Step", "action": "4"}``). A length
above ``MAX_FRAME_BYTES`` is refused before the body is read. Decoding never executes code from
the bytes and fails with ``ProtocolError`` naming the bad field.

This module is plain data (no I/O) and imports nothing heavy: the worker imports it at start.
"""

from __future__ import annotations

import struct
from typing import Annotated, Final

import msgspec
from msgspec import Meta

from agentgym.protocol.errors import ProtocolError

ENVWORKER_VERSION: Final = 1
"""Bumped when a message below changes incompatibly; checked in the Open/Ready handshake."""

PREFIX: Final = struct.Struct("<I")
PREFIX_BYTES: Final = PREFIX.size
MAX_FRAME_BYTES: Final = 8 * 1024 * 1024
"""Largest body either side accepts; observations and actions are text, far below this."""

ShortStr = Annotated[str, Meta(max_length=256)]
Scalar = str | int | float | bool
Info = dict[ShortStr, Scalar]
"""Small per-step facts an env reports (``success``, ``turns``); msgpack scalars only."""
Option = Scalar | list[Scalar]
"""The value of one env constructor option: a scalar, or a list of them (maze's train_sizes).
The one definition: the config's ``env.kwargs``, the Welcome's ``env_kwargs`` and ``Open`` use it."""
Options = dict[ShortStr, Option | None]
"""Env constructor options as they come from the config (None: the env's default)."""


class _Msg(msgspec.Struct, tag=True, kw_only=True, forbid_unknown_fields=True):
    """Base of the worker messages; the tag is the class name."""


# ---------------------------------------------------------------- pool -> worker


class Open(_Msg):
    """First request: build the env. ``target`` is ``"module.path:ClassName"``, resolved by the pool
    so that envs registered only in the actor process work in the worker too."""

    version: int
    env: ShortStr
    target: Annotated[str, Meta(max_length=1024)]
    kwargs: Options = {}


class Reset(_Msg):
    task_id: Annotated[int, Meta(ge=0)]


class Step(_Msg):
    action: str


class Expert(_Msg):
    """Ask the env's scripted expert for the next action."""


class Close(_Msg):
    """Close the env and exit; no reply."""


# ---------------------------------------------------------------- worker -> pool


class Ready(_Msg):
    """The env was built; ``version`` is the worker's ENVWORKER_VERSION."""

    version: int
    pid: int


class Observation(_Msg):
    """Reply to Reset (``instructions`` filled) and to Step."""

    text: str
    reward: float = 0.0
    done: bool = False
    info: Info = {}
    instructions: str = ""


class Action(_Msg):
    """Reply to Expert."""

    text: str


FailureKind = Annotated[str, Meta(max_length=64)]


class Failure(_Msg):
    """The request could not be served. ``kind``: ``env_error`` (the env raised; the worker lives on),
    ``init_error`` (the env could not be built), ``protocol`` (a bad request; the worker exits),
    ``state`` (e.g. Step before Reset)."""

    kind: FailureKind
    message: str
    traceback: str = ""
    """Where the env raised (for the pool's log; the episode's error carries only ``message``)."""


Request = Open | Reset | Step | Expert | Close
Reply = Ready | Observation | Action | Failure

_ENCODER: Final = msgspec.msgpack.Encoder()
_REQUESTS: Final = msgspec.msgpack.Decoder(Request)
_REPLIES: Final = msgspec.msgpack.Decoder(Reply)


class FrameTooLarge(ProtocolError):
    """A length prefix announced more bytes than MAX_FRAME_BYTES."""


def pack_frame(msg: Request | Reply) -> bytes:
    """Length prefix + msgpack body of ``msg``, ready to write to a pipe."""
    body = _ENCODER.encode(msg)
    if len(body) > MAX_FRAME_BYTES:
        raise FrameTooLarge(
            f"{type(msg).__name__}: body of {len(body)} bytes exceeds the {MAX_FRAME_BYTES}-byte env frame limit"
        )
    return PREFIX.pack(len(body)) + body


def body_length(prefix: bytes, source: str = "env worker") -> int:
    """The body length announced by a 4-byte prefix; refuses oversized frames before they are read."""
    if len(prefix) != PREFIX_BYTES:
        raise ProtocolError(f"{source}: frame prefix must be {PREFIX_BYTES} bytes, got {len(prefix)}")
    (n,) = PREFIX.unpack(prefix)
    if n > MAX_FRAME_BYTES:
        raise FrameTooLarge(
            f"{source}: frame announces {n} bytes (prefix {prefix.hex()}), more than the "
            f"{MAX_FRAME_BYTES}-byte limit; the stream is corrupt or not an env worker"
        )
    return n


def _decode(decoder: msgspec.msgpack.Decoder, body: bytes, what: str, source: str) -> object:
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as exc:  # names the field: "Expected `int`, got `str` - at `$.task_id`"
        raise ProtocolError(f"{source}: invalid {what}: {exc}") from None
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"{source}: {what} is not valid msgpack ({exc}); first bytes {body[:16].hex()}") from None


def decode_request(body: bytes, source: str = "env pool") -> Request:
    """A request body (without prefix) as its struct."""
    return _decode(_REQUESTS, body, "request", source)  # type: ignore[return-value]  # _REQUESTS decodes only a Request


def decode_reply(body: bytes, source: str = "env worker") -> Reply:
    """A reply body (without prefix) as its struct."""
    return _decode(_REPLIES, body, "reply", source)  # type: ignore[return-value]  # _REPLIES decodes only a Reply
