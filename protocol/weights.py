"""Weights as chunks of named tensors: how a weight version is cut up and put back together.

    chunks = make_chunks(version, tensors, chunk_bytes)          # learner: [(WeightChunk, memoryview)]
    chunks = make_chunks(version, tensors, chunk_bytes, alloc=pool.take)   # into buffers kept between exports
    asm = Assembler(into=kept)                                   # actor, per fetch (kept: WeightBuffers)
    for msg, data in received: verify_chunk(msg, data); asm.add(msg, data)
    tensors = asm.finish()                                       # [RawTensor] over whole buffers

The learner turns each tensor into raw bytes (any dtype, bfloat16 included: this module never
interprets them) and calls ``make_chunks``. A tensor that does not fit the room left in a chunk
starts the next one; a tensor larger than a chunk is split across chunks
(``TensorMeta.part_offset`` says where each slice goes), so no tensor is too large to send and
every data frame stays within ``chunk_bytes`` (itself under the wire's 1 GiB frame limit). The
actor checks each chunk with ``verify_chunk`` (size and crc32); ``Assembler`` copies each tensor
once into a buffer the actor keeps between updates (``WeightBuffers``; without one, a tensor
that lies whole in one chunk stays a view into the received frame and only split tensors are
copied); ``finish`` refuses a tensor with bytes missing.

Payload kinds: this is the full-weights payload (HF tensor names, whole tensors). Another kind
(adapters, say) reuses the same chunking and assembly with its own names; what a kind means is
decided by whoever sends and loads it, not here.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

# CRC-32 as zlib computes it (the same values: the wire's ``crc32`` fields), from zlib-ng, whose
# vectorised version sums 14-23 GiB/s on one core of the 2-core VM where zlib's own does 2.2:
# at 1.5B that was ~1.3 s of CPU per update on each side (docs/benchmarks.md).
from zlib_ng.zlib_ng import crc32

from agentgym.protocol.errors import ProtocolError
from agentgym.protocol.messages import TensorMeta, WeightChunk

ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class RawTensor:
    name: str
    dtype: str
    shape: tuple[int, ...]
    data: bytes | bytearray | memoryview | TensorSource
    """The bytes, or (learner side) a ``TensorSource`` that writes them where ``make_chunks`` asks."""


def tensor_nbytes(dtype: str, shape: Iterable[int]) -> int:
    n = ITEMSIZE[dtype]
    for d in shape:
        n *= d
    return n


CRC_THREADS = max(1, min(8, (os.cpu_count() or 1) - 1))
"""Workers that sum chunks while the next is filled (the filling thread is the one more)."""


@runtime_checkable
class TensorSource(Protocol):
    """Bytes that are not in host memory yet (a tensor on a GPU, say): ``make_chunks`` asks the
    source to write each slice straight into its chunk, so the data is copied once, from where
    it lives, instead of to the host and then again into the chunk."""

    nbytes: int

    def write(self, offset: int, dest: memoryview) -> None:
        """Fill ``dest`` with the tensor's bytes ``[offset, offset + len(dest))``."""

    def host_bytes(self) -> bytes:
        """The whole tensor's bytes in host memory (for a digest)."""


class ChunkBuffers:
    """Chunk buffers kept from one export for the next (``make_chunks(alloc=pool.take)``).

    A new chunk buffer is fresh memory, and writing it first costs a page fault per page (and
    the kernel's zeroing): measured at 1.5 GiB on a 2-core VM, chunking took 1.8-3.7 s into fresh
    buffers and 0.75 s into buffers already used (docs/benchmarks.md). A buffer goes back to the
    pool once nothing holds a view of it any more: not the snapshot being served, not a ZeroMQ
    send still in flight (a zero-copy frame keeps its view alive until ZeroMQ is done with it),
    so reuse never overwrites bytes that someone may still read. At most ``keep_bytes`` wait in
    the pool (the learner keeps about one export's worth: with the served snapshot that is the
    two exports a swap holds at its peak anyway, kept rather than returned to the OS).
    Thread-safe: buffers come back on whichever thread drops the last view."""

    def __init__(self, keep_bytes: int) -> None:
        self.keep_bytes = keep_bytes
        self._free: dict[int, list[np.ndarray]] = {}
        self._free_bytes = 0
        self._lock = threading.Lock()
        self.reused = 0
        """Buffers handed out again (for tests and metrics)."""

    def take(self, nbytes: int) -> memoryview:
        """A writable buffer of ``nbytes`` (contents undefined): a kept one when one fits."""
        with self._lock:
            kept = self._free.get(nbytes)
            base = kept.pop() if kept else None
            if base is not None:
                self._free_bytes -= nbytes
                self.reused += 1
        if base is None:
            base = np.empty(nbytes, np.uint8)
        loan = base[:]  # a view of its own: when it dies, every view taken of it has died first
        weakref.finalize(loan, self._give_back, base)
        return memoryview(loan).cast("B")  # type: ignore[arg-type]  # numpy's stubs give ndarray __buffer__ only from Python 3.12

    def _give_back(self, base: np.ndarray) -> None:
        with self._lock:
            if self._free_bytes + base.nbytes <= self.keep_bytes:
                self._free.setdefault(base.nbytes, []).append(base)
                self._free_bytes += base.nbytes

    def clear(self) -> None:
        """Let every kept buffer go (back to the OS)."""
        with self._lock:
            self._free.clear()
            self._free_bytes = 0


def _fresh(nbytes: int) -> memoryview:
    return memoryview(np.empty(nbytes, np.uint8)).cast("B")  # type: ignore[arg-type]  # numpy's stubs give ndarray __buffer__ only from Python 3.12


def make_chunks(
    version: int,
    tensors: Iterable[RawTensor],
    chunk_bytes: int,
    alloc: Callable[[int], memoryview] = _fresh,
) -> list[tuple[WeightChunk, memoryview]]:
    """Pack tensors, in order, into chunks of at most ``chunk_bytes`` each (a crc32 per chunk).
    A tensor that does not fit the room left starts a new chunk if it fits one whole; only a
    tensor larger than a chunk is split (filling the room left, then whole chunks). The data is
    copied once, into the chunks (from a ``TensorSource`` by the source itself): the caller may
    change its tensors once this returns. ``alloc(nbytes)``: where each chunk's bytes go (a fresh
    buffer, or ``ChunkBuffers.take``)."""
    if chunk_bytes < 1:
        raise ValueError(f"make_chunks: chunk_bytes={chunk_bytes} must be >= 1")
    groups: list[list[tuple[RawTensor, int, int]]] = [[]]  # (tensor, part_offset, nbytes)
    room = chunk_bytes
    for t in tensors:
        size = t.data.nbytes if isinstance(t.data, TensorSource) else memoryview(t.data).nbytes
        expect = tensor_nbytes(t.dtype, t.shape)
        if size != expect:
            raise ValueError(
                f"make_chunks: tensor {t.name!r} has {size} bytes, {t.dtype}{list(t.shape)} needs {expect}"
            )
        if size > room and size <= chunk_bytes and room < chunk_bytes:
            # It fits a chunk of its own: start one rather than split it. A receiver without kept
            # buffers then keeps it as a view into the frame instead of copying its slices, and
            # one with them copies it in one piece.
            groups.append([])
            room = chunk_bytes
        pos = 0
        while True:
            if room == 0:
                groups.append([])
                room = chunk_bytes
            n = min(room, size - pos)
            groups[-1].append((t, pos, n))
            room -= n
            pos += n
            if pos >= size:
                break
    if not groups[-1]:
        groups.pop()
    # crc32 (lets go of the GIL) of chunk i runs on a worker while chunk i+1 is filled:
    # at 1.5B (3 GB) on one thread it was a third of an export.
    pool = ThreadPoolExecutor(max(1, min(CRC_THREADS, len(groups))), thread_name_prefix="crc32")
    try:
        datas, crcs = [], []
        for group in groups:
            datas.append(_fill(group, alloc))
            crcs.append(pool.submit(crc32, datas[-1]))
        out: list[tuple[WeightChunk, memoryview]] = []
        for i, (group, data, crc) in enumerate(zip(groups, datas, crcs)):
            metas, offset = [], 0
            for t, part, n in group:
                metas.append(TensorMeta(t.name, t.dtype, list(t.shape), offset, n, part))  # type: ignore[arg-type]  # RawTensor.dtype is a str holding one of ITEMSIZE's names
                offset += n
            msg = WeightChunk(
                version=version,
                chunk=i,
                num_chunks=len(groups),
                tensors=metas,
                crc32=crc.result(),
                nbytes=len(data),
            )
            out.append((msg, data))
        return out
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _fill(group: list[tuple[RawTensor, int, int]], alloc: Callable[[int], memoryview]) -> memoryview:
    """One chunk's bytes: a buffer from ``alloc`` (not zeroed first) with every slice copied in."""
    buf = alloc(sum(n for _, _, n in group))
    at = 0
    for t, part, n in group:
        if n:
            if isinstance(t.data, TensorSource):
                t.data.write(part, buf[at : at + n])
            else:
                buf[at : at + n] = memoryview(t.data).cast("B")[part : part + n]
        at += n
    return buf


def verify_chunk(msg: WeightChunk, data: bytes | memoryview) -> None:
    """Raise ``ProtocolError`` if the data frame does not match the chunk's size or crc32."""
    check_size(msg, data)
    check_crc(msg, data)


def check_size(msg: WeightChunk, data: bytes | memoryview) -> None:
    """The size half of ``verify_chunk``: what must hold before ``Assembler.add`` reads the frame."""
    if len(data) != msg.nbytes:
        raise ProtocolError(f"weight chunk {msg.chunk} of v{msg.version}: {len(data)} bytes, expected {msg.nbytes}")


def check_crc(msg: WeightChunk, data: bytes | memoryview) -> None:
    """The crc32 half of ``verify_chunk`` (it lets go of the GIL: it can run on a worker thread)."""
    crc = crc32(data)
    if crc != msg.crc32:
        raise ProtocolError(
            f"weight chunk {msg.chunk} of v{msg.version}: crc32 {crc:#010x} != {msg.crc32:#010x} (corrupted)"
        )


def chunk_tensors(msg: WeightChunk, data: bytes | memoryview) -> list[RawTensor]:
    """The slices of a verified chunk as zero-copy byte views (a split tensor appears once per
    chunk it spans, with only its slice: use ``Assembler`` to get whole tensors)."""
    view = memoryview(data).cast("B")
    return [RawTensor(m.name, m.dtype, tuple(m.shape), view[m.offset : m.offset + m.nbytes]) for m in msg.tensors]


class WeightBuffers:
    """Per-tensor buffers an actor keeps from one fetch for the next (``Assembler(into=...)``).

    Received frames are fresh memory: ZeroMQ's I/O thread allocates each, and a frame kept
    until the whole version has arrived is given back to the OS after the load, so the next
    update faults every page in again (measured at 1.5B: ~60% of the fetching process's CPU, 1.2
    million page faults per 2.9 GiB). Copied into kept buffers as it arrives, each frame is freed
    at once and its memory reused for the next frame (chunks below glibc's mmap threshold,
    ``learner.weight_chunk_mib``), and the kept buffers are faulted in once: from the second
    update on, no page faults, for one copy of the bytes. The buffers hold one copy of the
    weights between updates (the peak a fetch held anyway). Tensors handed out from them are
    valid until the next fetch into them (one fetch at a time per ``WeightBuffers``): engines
    copy what they load (see ``InferenceEngine.update_weights``)."""

    def __init__(self) -> None:
        self._bufs: dict[str, np.ndarray] = {}

    def get(self, name: str, nbytes: int) -> memoryview:
        """The kept buffer for ``name`` (a new one if it is new or changed size); contents undefined."""
        buf = self._bufs.get(name)
        if buf is None or buf.nbytes != nbytes:
            buf = self._bufs[name] = np.empty(nbytes, np.uint8)
        return memoryview(buf).cast("B")  # type: ignore[arg-type]  # numpy's stubs give ndarray __buffer__ only from Python 3.12

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self._bufs.values())


class Assembler:
    """Whole tensors from verified chunks, in any order of arrival. Without ``into``, a tensor
    that lies whole in one chunk is a read-only view into that chunk's frame, not copied (the
    frame stays alive while the view does), and a tensor split across chunks is written once
    into a buffer allocated on its first slice. With ``into`` (``WeightBuffers``), every tensor is
    copied into its kept buffer, so no frame outlives its ``add``."""

    def __init__(self, into: WeightBuffers | None = None) -> None:
        self._into = into
        self._bufs: dict[str, tuple[str, tuple[int, ...], memoryview]] = {}
        self._filled: dict[str, int] = {}
        self._split: set[str] = set()  # names whose buffer is written slice by slice (not a view)

    def add(self, msg: WeightChunk, data: bytes | memoryview) -> None:
        src = memoryview(data).cast("B")
        for m in msg.tensors:
            where = f"weight chunk {msg.chunk} of v{msg.version}, tensor {m.name!r}"
            got = self._bufs.get(m.name)
            if got is None:
                if m.dtype not in ITEMSIZE:
                    raise ProtocolError(f"{where}: unknown dtype {m.dtype!r}")
                size = tensor_nbytes(m.dtype, m.shape)
                if self._into is None and m.part_offset == 0 and m.nbytes == size:  # whole in this chunk: a view
                    self._bufs[m.name], self._filled[m.name] = (
                        (m.dtype, tuple(m.shape), src[m.offset : m.offset + size]),
                        size,
                    )
                    continue
                # not zeroed first: every byte is written by a slice, and finish() refuses gaps
                buf = self._into.get(m.name, size) if self._into is not None else _fresh(size)
                got = (m.dtype, tuple(m.shape), buf)
                self._bufs[m.name], self._filled[m.name] = got, 0
                self._split.add(m.name)
            dtype, shape, buf = got
            if (dtype, shape) != (m.dtype, tuple(m.shape)):
                raise ProtocolError(
                    f"{where}: {m.dtype}{m.shape} disagrees with an earlier slice's {dtype}{list(shape)}"
                )
            if m.name not in self._split:
                raise ProtocolError(f"{where}: a slice of a tensor that already arrived whole")
            if m.part_offset + m.nbytes > len(buf):
                raise ProtocolError(
                    f"{where}: slice [{m.part_offset}, +{m.nbytes}) ends past the tensor's {len(buf)} bytes"
                )
            buf[m.part_offset : m.part_offset + m.nbytes] = src[m.offset : m.offset + m.nbytes]
            self._filled[m.name] += m.nbytes

    def finish(self) -> list[RawTensor]:
        """Every tensor, whole; raises ``ProtocolError`` if any has bytes missing (or doubled)."""
        bad = [
            f"{n} ({self._filled[n]}/{len(b)} bytes)"
            for n, (_, _, b) in self._bufs.items()
            if self._filled[n] != len(b)
        ]
        if bad:
            raise ProtocolError(f"weights incomplete: {', '.join(bad[:5])}")
        return [RawTensor(n, d, s, b) for n, (d, s, b) in self._bufs.items()]


# ---------------------------------------------------------------- flight recorder digests
def tensor_digest(name: str, data: bytes | bytearray | memoryview, value: int | None = None) -> int:
    """One tensor's term of a weights digest: crc32 of its name, then of its bytes (``value``:
    the running crc of its earlier parts, for a tensor split over chunks)."""
    return crc32(memoryview(data).cast("B"), crc32(name.encode()) if value is None else value)


def weights_digest(terms: Iterable[int]) -> int:
    """A set of tensors' digest: their ``tensor_digest`` terms summed mod 2**32 (order-free: an
    engine sums what it serves in any order). The learner's export and the weights an actor's
    engine serves after an update must give the same number (learner/records/flight_recorder.py)."""
    return sum(terms) % 2**32


def chunks_digest(chunks: Iterable[tuple[WeightChunk, bytes | bytearray | memoryview]]) -> tuple[int, int]:
    """The ``weights_digest`` of the tensors in a version's chunks and how many tensors they hold."""
    running: dict[str, int] = {}
    for msg, data in chunks:
        view = memoryview(data).cast("B")
        for m in msg.tensors:  # a split tensor's parts come in order, chunk after chunk
            running[m.name] = tensor_digest(m.name, view[m.offset : m.offset + m.nbytes], running.get(m.name))
    return weights_digest(running.values()), len(running)
