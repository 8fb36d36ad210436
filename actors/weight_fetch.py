"""The actor's weight fetcher: pulls a weight version's chunks from the learner or a relay.

    version, tensors = await fetch_weights(ctx, weights_addr("tcp://learner:5555", welcome.weights_port), ready)

Chunks are requested a few at a time over pyzmq's asyncio sockets, each checked by crc32 (on a
worker thread, while the chunk is copied) and copied once into its tensors' buffers
(protocol/weights.py); a source that stalls is left for the next one with the verified chunks
kept.
"""

from __future__ import annotations

import asyncio
import time
import warnings
from typing import cast

import structlog
import zmq.asyncio

from agentgym.actors.transport import dealer_socket
from agentgym.auth.keys import ClientKeys
from agentgym.protocol import (
    WeightChunk,
    WeightGone,
    WeightRequest,
    WeightsReady,
    decode,
    encode,
)
from agentgym.protocol.limits import WEIGHT_CHUNKS_QUEUED
from agentgym.protocol.weights import Assembler, RawTensor, WeightBuffers, check_crc, check_size

log = structlog.get_logger(__name__)


def _queue_cap(s: zmq.Socket) -> None:
    s.setsockopt(zmq.RCVHWM, WEIGHT_CHUNKS_QUEUED)  # chunks of up to the model's size each


def _dealer(ctx: zmq.asyncio.Context, addr: str, keys: ClientKeys | None, max_frame: int | None) -> zmq.asyncio.Socket:
    # An asyncio context's socket: awaitable sends and receives (dealer_socket is typed for both kinds).
    return cast(zmq.asyncio.Socket, dealer_socket(ctx, addr, keys=keys, max_frame=max_frame, before_connect=_queue_cap))


def weights_addr(control_addr: str, port: int) -> str:
    """The learner's weights address: its control address's host with the Welcome's port."""
    return f"{control_addr.rsplit(':', 1)[0]}:{port}"


async def _add_checked(asm: Assembler, msg: WeightChunk, data: memoryview) -> None:
    """Copy one chunk into its tensors, its size checked first and its crc32 alongside."""
    # The crc32 runs on a worker thread while this one copies the chunk into its tensors (alone,
    # 1.5 GiB took 0.68 s to check and 1.07 s to copy). A bad crc fails the fetch before its
    # tensors are handed out, as a bad size does before the copy.
    check_size(msg, data)
    crc = asyncio.get_running_loop().run_in_executor(None, check_crc, msg, data)  # starts now
    try:
        asm.add(msg, data)
    finally:
        await crc


class _Sources:
    """The sources of one ``fetch_weights``, best first, and the dealer socket open to the current one."""

    def __init__(
        self, ctx: zmq.asyncio.Context, addrs: list[str], keys: list[ClientKeys | None], max_frame: int | None
    ) -> None:
        self.ctx, self.addrs, self.keys, self.max_frame = ctx, addrs, keys, max_frame
        self.at = 0
        self.sock = _dealer(ctx, addrs[0], keys[0], max_frame)

    @property
    def last(self) -> bool:
        return self.at == len(self.addrs) - 1

    def reconnect(self, skip: int) -> None:
        """Closes the socket and opens a fresh one to the source ``skip`` places further on."""
        self.sock.close(linger=0)
        self.at += skip
        self.sock = _dealer(self.ctx, self.addrs[self.at], self.keys[self.at], self.max_frame)

    def leave_stalled(self, version: int, done: int, total: int, *, timeout_s: float, stall_s: float) -> None:
        """The current source sent nothing in time: on the last one, TimeoutError; else the next one."""
        if self.last:
            raise TimeoutError(
                f"weights v{version}: {done}/{total} chunks from {self.addrs[self.at]} after {timeout_s:.0f} s"
                + (f" (frames over {self.max_frame} bytes are refused unread)" if self.max_frame else "")
            ) from None
        log.warning(
            "weights_source_stalled",
            source=self.addrs[self.at],
            next=self.addrs[self.at + 1],
            version=version,
            chunks_done=done,
            chunks=total,
            stall_s=stall_s,
            frame_cap_bytes=self.max_frame,
        )
        self.reconnect(1)


async def fetch_weights(
    ctx: zmq.asyncio.Context,
    addr: str | list[str],
    ready: WeightsReady,
    *,
    have_version: int = -1,
    window: int = 4,
    timeout_s: float = 120.0,
    keys: ClientKeys | None | list[ClientKeys | None] = None,
    stall_s: float = 5.0,
    into: WeightBuffers | None = None,
    max_frame: int | None = None,
) -> tuple[int, list[RawTensor]]:
    """Pull ``ready.version`` (``window`` requests in flight), each chunk checked by crc32 and
    copied once, from the received frame into its tensors' buffers (protocol/weights.py).

    ``have_version`` >= 0: the caller holds that version and can load a subset of tensors;
    chunks unchanged since (``ready.chunk_versions``) are skipped and only the changed tensors
    are returned. Returns (version, tensors). If the version is superseded while fetching,
    starts over on the latest one, whole, so the result may be newer than asked for.

    ``addr`` may list sources, best first (a relay, then the learner), with ``keys`` one per
    source: a source that sends nothing for ``stall_s`` while others remain is abandoned for the
    next; the chunks already verified are kept, and the rest are asked of the next source for
    the same version (a chunk is accepted only for the version being assembled, so sources never
    mix versions). The last source gets the whole ``timeout_s``.

    ``into``: buffers kept from one fetch for the next (an actor passes its own): each chunk is
    copied into them as it arrives and its frame freed at once, so an update does not fault in
    fresh memory; the tensors returned are valid until the next fetch into the same buffers.
    Without it, tensors whole in one chunk are views into their received frames.

    ``max_frame``: the largest frame taken (protocol/limits.py ``weights_frame`` of the manifest;
    None: the wire's ceiling). A source that sends a larger one has its connection dropped unread
    and delivers nothing: it stalls, and is left as above (the last one times out).
    """
    sources = [addr] if isinstance(addr, str) else list(addr)
    source_keys = keys if isinstance(keys, list) else [keys] * len(sources)
    if not sources or len(source_keys) != len(sources):
        raise ValueError(f"fetch_weights: {len(sources)} sources but {len(source_keys)} keys")
    src = _Sources(ctx, sources, source_keys, max_frame)
    try:
        version, num_chunks = ready.version, ready.num_chunks
        wanted = list(range(num_chunks))
        if have_version >= 0 and len(ready.chunk_versions) == num_chunks:
            wanted = [i for i, v in enumerate(ready.chunk_versions) if v > have_version]
        while True:
            asm, got, in_flight = Assembler(into), set[int](), list[int]()
            todo = list(reversed(wanted))  # popped from the end: ascending
            deadline = time.monotonic() + timeout_s
            restart = None
            while len(got) < len(wanted) and restart is None:
                left = deadline - time.monotonic() if src.last else stall_s
                try:
                    if left <= 0:
                        raise TimeoutError
                    async with asyncio.timeout(left):  # sends too: no peer (refused by CURVE) blocks them
                        while todo and len(in_flight) < window:
                            chunk = todo.pop()
                            await src.sock.send_multipart(encode(WeightRequest(version=version, chunk=chunk)))
                            in_flight.append(chunk)
                        frames = await src.sock.recv_multipart(copy=False)  # no copy: the assembler copies once
                except TimeoutError:
                    src.leave_stalled(version, len(got), len(wanted), timeout_s=timeout_s, stall_s=stall_s)
                    todo += sorted(in_flight, reverse=True)  # asked again of the next source, first
                    in_flight = []
                    deadline = time.monotonic() + timeout_s
                    continue
                msg, data = decode([f.buffer for f in frames])
                if isinstance(msg, WeightGone):
                    restart = msg.latest
                elif isinstance(msg, WeightChunk) and msg.version == version and msg.chunk not in got:
                    await _add_checked(asm, msg, data[0])
                    got.add(msg.chunk)
                    if msg.chunk in in_flight:
                        in_flight.remove(msg.chunk)
                    del frames, data  # copied into ``into`` (or viewed by asm): the frame may go now
                    if msg.num_chunks != num_chunks:  # learned the size of a version we restarted on
                        num_chunks = msg.num_chunks
                        wanted = list(range(num_chunks))
                        todo = sorted(set(wanted) - got - set(in_flight), reverse=True)
            if restart is None:
                return version, asm.finish()
            log.info("weights_superseded", wanted=version, latest=restart)
            # Drain replies of the abandoned version, then ask for the new one's first chunk to learn its size.
            src.reconnect(0)  # same model, same size
            version, num_chunks, wanted = restart, 1, [0]
    finally:
        src.sock.close(linger=0)


def to_torch(raw: list[RawTensor]) -> dict:
    """The fetched tensors as torch tensors by name, for ``engine.update_weights``."""
    import torch

    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    # Wrapped, no copy (an empty buffer cannot be wrapped). Fetched without kept buffers, tensors
    # that came whole in one chunk are views into the received frame, read-only: engines only read
    # what they load (copy_ into their parameters, a file, a digest), so torch's warning about
    # non-writable buffers is silenced.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given buffer is not writable")
        return {
            t.name: torch.frombuffer(t.data, dtype=dtypes[t.dtype]).reshape(t.shape)
            if len(t.data)  # type: ignore[arg-type]  # bytes here, never a TensorSource
            else torch.empty(t.shape, dtype=dtypes[t.dtype])
            for t in raw
        }
