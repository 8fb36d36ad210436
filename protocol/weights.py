"""Weights as chunks of named tensors: how a weight version is cut up and put back together.

The learner turns each tensor into raw bytes (any dtype, bfloat16 included: this module never
interprets them) and calls ``make_chunks``; an actor checks each chunk with ``verify_chunk``
and reads the tensors' byte ranges with ``chunk_tensors``. A tensor larger than the chunk size
gets a chunk of its own.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from dataclasses import dataclass

from agentgym.protocol.errors import ProtocolError
from agentgym.protocol.messages import TensorMeta, WeightChunk


@dataclass(frozen=True)
class RawTensor:
    name: str
    dtype: str
    shape: tuple[int, ...]
    data: bytes | memoryview


def make_chunks(
    version: int, tensors: Iterable[RawTensor], chunk_bytes: int
) -> list[tuple[WeightChunk, bytes]]:
    """Group tensors into chunks of about ``chunk_bytes`` (each with its crc32)."""
    groups: list[list[RawTensor]] = [[]]
    size = 0
    for t in tensors:
        n = len(memoryview(t.data).cast("B"))
        if groups[-1] and size + n > chunk_bytes:
            groups.append([])
            size = 0
        groups[-1].append(t)
        size += n
    out: list[tuple[WeightChunk, bytes]] = []
    for i, group in enumerate(groups):
        metas, offset = [], 0
        for t in group:
            n = len(memoryview(t.data).cast("B"))
            metas.append(TensorMeta(t.name, t.dtype, list(t.shape), offset, n))  # type: ignore[arg-type]
            offset += n
        data = b"".join(bytes(memoryview(t.data).cast("B")) for t in group)
        msg = WeightChunk(
            version=version,
            chunk=i,
            num_chunks=len(groups),
            tensors=metas,
            crc32=zlib.crc32(data),
            nbytes=len(data),
        )
        out.append((msg, data))
    return out


def verify_chunk(msg: WeightChunk, data: bytes | memoryview) -> None:
    """Raise ``ProtocolError`` if the data frame does not match the chunk's size or crc32."""
    if len(data) != msg.nbytes:
        raise ProtocolError(f"weight chunk {msg.chunk} of v{msg.version}: {len(data)} bytes, expected {msg.nbytes}")
    crc = zlib.crc32(data)
    if crc != msg.crc32:
        raise ProtocolError(
            f"weight chunk {msg.chunk} of v{msg.version}: crc32 {crc:#010x} != {msg.crc32:#010x} (corrupted)"
        )


def chunk_tensors(msg: WeightChunk, data: bytes | memoryview) -> list[RawTensor]:
    """The tensors of a verified chunk as zero-copy byte views."""
    view = memoryview(data).cast("B")
    return [
        RawTensor(m.name, m.dtype, tuple(m.shape), view[m.offset : m.offset + m.nbytes])
        for m in msg.tensors
    ]
