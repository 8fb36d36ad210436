"""Weight transfer at real sizes' rules: tensors split across chunks, exact round trips (bf16
included), the frame limit, refused corruption, and only changed tensors travelling (real
ZeroMQ sockets between the learner's hub and the actor's fetcher)."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import numpy as np
import pytest
import torch
import zmq.asyncio
from test_transport import HubThread

from agentgym.actors.weight_fetch import fetch_weights
from agentgym.host.netutil import free_port_pair
from agentgym.learner.training.weight_export import WeightExporter
from agentgym.learner.transport import WeightSnapshot
from agentgym.protocol import ProtocolError, WeightsReady, decode, encode
from agentgym.protocol.weights import Assembler, RawTensor, make_chunks, verify_chunk
from agentgym.protocol.wire import MAX_WEIGHT_DATA


def raw(name: str, t: torch.Tensor) -> RawTensor:
    ints = {4: torch.int32, 2: torch.int16}[t.element_size()]
    return RawTensor(
        name, str(t.dtype).removeprefix("torch."), tuple(t.shape), t.contiguous().view(ints).numpy().tobytes()
    )


def back(t: RawTensor) -> torch.Tensor:
    dtype = getattr(torch, t.dtype)
    return torch.frombuffer(t.data, dtype=dtype).reshape(t.shape) if len(t.data) else torch.empty(t.shape, dtype=dtype)


def test_a_tensor_larger_than_a_chunk_round_trips_exactly_and_frames_stay_small() -> None:
    g = torch.Generator().manual_seed(0)
    tensors = {
        "embed.weight": torch.randn(301, 77, generator=g).to(torch.bfloat16),  # 46,354 bytes: ~4.6 chunks
        "norm.weight": torch.randn(77, generator=g),
        "big.weight": torch.randn(129, 50, generator=g),  # 25,800 bytes
        "empty.bias": torch.zeros(0),
        "half.weight": torch.randn(13, 3, generator=g).to(torch.float16),
    }
    chunk_bytes = 10_000
    chunks = make_chunks(7, [raw(k, v) for k, v in tensors.items()], chunk_bytes)
    fits = make_chunks(7, [raw(f"t{i}", torch.zeros(1500)) for i in range(5)], chunk_bytes)  # 6,000 bytes each
    assert [[m.name for m in msg.tensors] for msg, _ in fits] == [["t0"], ["t1"], ["t2"], ["t3"], ["t4"]]
    assert all(len(d) <= chunk_bytes for _, d in chunks)
    parts: dict[str, int] = {}
    for msg, _ in chunks:
        for m in msg.tensors:
            parts[m.name] = parts.get(m.name, 0) + 1
    # only a tensor larger than a chunk is split; one that fits a chunk starts a new one instead
    # embed: 4 full chunks + 6,354 bytes; norm after it; big (25,800) split: the 3,338 left, 10,000
    # twice, 2,462; then the empty bias and half (78 bytes) whole
    assert parts == {"embed.weight": 5, "norm.weight": 1, "big.weight": 4, "empty.bias": 1, "half.weight": 1}
    assert len(chunks) == 8
    asm = Assembler()
    for msg, data in random.Random(0).sample(chunks, len(chunks)):  # any arrival order
        got, frames = decode(encode(msg, data))  # through the wire codec
        verify_chunk(got, frames[0])
        asm.add(got, frames[0])
    out = {t.name: back(t) for t in asm.finish()}
    assert out.keys() == tensors.keys()
    for k, v in tensors.items():
        assert out[k].dtype == v.dtype and torch.equal(out[k], v), k


def test_the_largest_chunk_setting_keeps_every_frame_under_the_wire_limit() -> None:
    big = RawTensor("w", "float32", (3, 2**20), memoryview(bytearray(3 * 4 * 2**20)))
    sizes = [len(d) for _, d in make_chunks(0, [big], 5 * 2**20)]
    assert sizes == [5 * 2**20, 5 * 2**20, 2 * 2**20]
    from agentgym.config import LearnerConfig

    limit = LearnerConfig.model_fields["weight_chunk_mib"].metadata[-1].le  # the config's bound
    assert limit * 2**20 <= MAX_WEIGHT_DATA
    with pytest.raises(Exception, match="less than or equal to 1024"):
        LearnerConfig(weight_chunk_mib=limit + 1)


def test_a_corrupted_chunk_or_a_missing_slice_is_refused() -> None:
    t = torch.arange(5000, dtype=torch.float32)
    chunks = make_chunks(3, [raw("w", t)], 8000)
    msg, data = chunks[1]
    bad = bytearray(data)
    bad[100] ^= 0xFF
    with pytest.raises(ProtocolError, match=r"crc32 .* \(corrupted\)"):
        verify_chunk(msg, bytes(bad))
    with pytest.raises(ProtocolError, match="bytes, expected"):
        verify_chunk(msg, data[:-4])
    asm = Assembler()
    for m, d in chunks[:-1]:
        asm.add(m, d)
    with pytest.raises(ProtocolError, match=r"weights incomplete: w \(16000/20000 bytes\)"):
        asm.finish()


def test_only_tensors_changed_since_the_actors_version_travel() -> None:
    port = free_port_pair()
    rng = np.random.default_rng(2)
    arrays = {f"layer{i}.weight": rng.standard_normal((40, 25)).astype(np.float32) for i in range(8)}
    exporter = WeightExporter(chunk_bytes=8_000)  # two tensors per chunk

    def publish(ht: HubThread, version: int) -> WeightsReady:
        tensors = [RawTensor(k, "float32", v.shape, v.tobytes()) for k, v in arrays.items()]
        chunks, chunk_versions = exporter.build(version, tensors)
        snap = WeightSnapshot.build(version, chunks)
        ht.commands.put(lambda hub: hub.publish_weights(snap))
        return WeightsReady(
            version=version,
            step=version,
            turn_limit=3,
            num_chunks=len(chunks),
            total_bytes=snap.total_bytes,
            chunk_versions=chunk_versions,
        )

    with HubThread(f"tcp://127.0.0.1:{port}") as ht:

        async def client() -> None:
            ctx = zmq.asyncio.Context()
            waddr = f"tcp://127.0.0.1:{port + 1}"
            r1 = publish(ht, 1)
            await asyncio.sleep(0.2)
            _, full = await fetch_weights(ctx, waddr, r1, have_version=-1)
            assert len(full) == 8
            arrays["layer5.weight"] += 1.0  # one tensor changes
            r2 = publish(ht, 2)
            assert sorted(r2.chunk_versions) == [1, 1, 1, 2]  # the changed one went last, in its own chunk
            await asyncio.sleep(0.2)
            served = ht.hub.weight_chunks_served
            _, delta = await fetch_weights(ctx, waddr, r2, have_version=1)
            assert ht.hub.weight_chunks_served - served == 1
            names = {t.name for t in delta}
            assert "layer5.weight" in names and len(names) == 2
            got = {t.name: np.frombuffer(t.data, np.float32).reshape(t.shape) for t in delta}
            assert all(np.array_equal(got[k], arrays[k]) for k in names)
            _, again = await fetch_weights(ctx, waddr, r2, have_version=-1)  # an actor without v1: all of it
            assert len(again) == 8
            ctx.term()

        asyncio.run(asyncio.wait_for(client(), 30))


def test_trained_tensors_count_as_changed_and_frozen_ones_are_compared() -> None:
    rng = np.random.default_rng(3)
    arrays = {f"t{i}": rng.standard_normal(500).astype(np.float32) for i in range(4)}
    exporter = WeightExporter(chunk_bytes=2_000)  # one tensor per chunk

    def build(version: int) -> dict[str, int]:
        tensors = [RawTensor(k, "float32", v.shape, v.tobytes()) for k, v in arrays.items()]
        chunks, chunk_versions = exporter.build(version, tensors, trained={"t0", "t1"})
        for msg, data in chunks:
            verify_chunk(msg, data)
        return {msg.tensors[0].name: v for (msg, _), v in zip(chunks, chunk_versions)}

    assert build(1) == {"t0": 1, "t1": 1, "t2": 1, "t3": 1}
    arrays["t3"] += 1.0  # a frozen tensor that changed anyway (a buffer, say) is still caught
    # t0 and t1 are trained: taken as changed without a digest, even with the same bytes
    assert build(2) == {"t2": 1, "t0": 2, "t1": 2, "t3": 2}
    assert build(3) == {"t2": 1, "t3": 2, "t0": 3, "t1": 3}  # oldest change first


def test_the_trainer_names_what_it_trains_as_its_export_names_it(tmp_path: Path) -> None:
    from learner_fixtures import make_cfg

    from agentgym.learner.training.distributed import DataParallel
    from agentgym.learner.training.trainer import Trainer
    from agentgym.models.tiny import make_default_tiny_model

    trainer = Trainer.build(make_cfg(make_default_tiny_model(tmp_path / "m")), DataParallel())
    exported = {t.name for t in trainer.export_weights()}
    trained = trainer.trained_names()
    assert "model.embed_tokens.weight" in trained and exported == trained & exported
    assert exported - trained <= {n for n, _ in trainer.model.named_buffers()}  # only buffers are hashed
    trainer.model.model.norm.weight.requires_grad_(False)  # frozen: compared, not assumed changed
    assert "model.norm.weight" in exported and "model.norm.weight" not in trainer.trained_names()


def test_a_fetch_refuses_a_chunk_corrupted_on_the_way() -> None:
    # The actor sums each chunk on a worker thread while it copies it: a bad sum still fails the
    # fetch, naming the chunk, and no tensors are handed out.
    port = free_port_pair()
    t = torch.arange(30_000, dtype=torch.float32)
    chunks = make_chunks(4, [raw("w", t)], 40_000)
    msg, data = chunks[1]
    bad = bytearray(data)
    bad[7] ^= 0x01
    chunks[1] = (msg, bytes(bad))
    snap = WeightSnapshot.build(4, chunks)
    ready = WeightsReady(version=4, step=4, turn_limit=3, num_chunks=len(chunks), total_bytes=snap.total_bytes)
    with HubThread(f"tcp://127.0.0.1:{port}") as ht:
        ht.commands.put(lambda hub: hub.publish_weights(snap))

        async def client() -> None:
            ctx = zmq.asyncio.Context()
            await asyncio.sleep(0.2)
            try:
                with pytest.raises(ProtocolError, match=r"weight chunk 1 of v4: crc32 .* \(corrupted\)"):
                    await fetch_weights(ctx, f"tcp://127.0.0.1:{port + 1}", ready)
            finally:
                ctx.term()

        asyncio.run(asyncio.wait_for(client(), 30))


def test_tensors_written_into_their_chunks_by_the_trainer_make_the_same_chunks(tmp_path: Path) -> None:
    # export_weights(sources=True): each tensor writes its own slices into the chunks (from a GPU,
    # one copy); the chunks must be byte for byte those of the host-bytes path, split tensors,
    # the tied embedding sent once and bfloat16 included.
    from learner_fixtures import make_cfg

    from agentgym.learner.training.distributed import DataParallel
    from agentgym.learner.training.trainer import Trainer
    from agentgym.learner.training.trainer_state import TorchSource
    from agentgym.models.tiny import make_default_tiny_model

    trainer = Trainer.build(make_cfg(make_default_tiny_model(tmp_path / "m")), DataParallel())
    for dtype in ("float32", "bfloat16"):
        hosted = trainer.export_weights(dtype)
        sourced = trainer.export_weights(dtype, sources=True)
        assert [t.name for t in sourced] == [t.name for t in hosted]
        assert all(isinstance(t.data, TorchSource) for t in sourced)
        chunk_bytes = 7_777  # odd: most tensors split across chunks
        a, b = make_chunks(1, hosted, chunk_bytes), make_chunks(1, sourced, chunk_bytes)
        assert len(a) == len(b) > 3
        for (ma, da), (mb, db) in zip(a, b, strict=True):
            assert ma == mb and bytes(da) == bytes(db)
            verify_chunk(mb, db)
        # a frozen tensor is hashed from the source's bytes: unchanged, it keeps its version
        exporter = WeightExporter(chunk_bytes)
        exporter.build(1, sourced)
        _, versions = exporter.build(2, trainer.export_weights(dtype, sources=True), trained={"model.norm.weight"})
        assert sorted(set(versions)) == [1, 2]
        asm = Assembler()
        for m, d in b:
            asm.add(m, d)
        back_ = {t.name: t.data for t in asm.finish()}
        assert all(bytes(back_[t.name]) == bytes(t.data) for t in hosted)


def test_a_tensor_whole_in_one_chunk_is_not_copied_and_a_split_one_is_copied_once() -> None:
    whole = np.arange(100, dtype=np.float32)  # 400 bytes: fits the first chunk
    split = np.arange(300, dtype=np.float32)  # 1200 bytes: spans the rest
    chunks = make_chunks(
        5,
        [
            RawTensor("whole", "float32", (100,), whole.tobytes()),
            RawTensor("split", "float32", (300,), split.tobytes()),
        ],
        1000,
    )
    frames = [bytearray(d) for _, d in chunks]  # stand-ins for received frames
    asm = Assembler()
    for (msg, _), frame in zip(chunks, frames, strict=True):
        verify_chunk(msg, frame)
        asm.add(msg, frame)
    got = {t.name: t.data for t in asm.finish()}
    assert np.array_equal(np.frombuffer(got["whole"], np.float32), whole)
    assert np.array_equal(np.frombuffer(got["split"], np.float32), split)
    frames[0][0] ^= 0xFF  # the whole tensor is a view into its chunk's frame ...
    assert bytes(got["whole"][:1]) == bytes([frames[0][0]])
    assert not got["split"].readonly and got["split"].obj is not frames[1]  # ... the split one a buffer of its own
    with pytest.raises(ProtocolError, match="already arrived whole"):
        asm.add(*chunks[0])  # the same chunk again cannot overwrite it


def _address(view: memoryview) -> int:
    return np.frombuffer(view, np.uint8).__array_interface__["data"][0]


def test_chunk_buffers_come_back_only_once_nothing_holds_a_view_of_them() -> None:
    import gc

    from agentgym.protocol.weights import ChunkBuffers

    pool = ChunkBuffers(keep_bytes=1 << 20)
    a = pool.take(4096)
    a[:] = b"\x01" * 4096
    where = _address(a)
    held = a[100:200]  # what a zero-copy send or a served snapshot holds
    del a
    gc.collect()
    b = pool.take(4096)
    assert _address(b) != where and pool.reused == 0  # still in use: not handed out again
    assert bytes(held) == b"\x01" * 100
    del held
    c = pool.take(4096)  # the first buffer is free now: handed out again, no fresh memory
    assert _address(c) == where and pool.reused == 1
    assert _address(pool.take(2048)) not in (where, _address(b))  # another size: a fresh one
    del b, c
    small = ChunkBuffers(keep_bytes=4096)  # keeps at most this much
    x, y = small.take(4096), small.take(4096)
    del x, y
    assert small._free_bytes == 4096
    small.clear()
    assert small._free_bytes == 0


def test_the_chunk_checksum_is_zlibs_crc32() -> None:
    # The wire's crc32 fields are zlib's CRC-32: a faster implementation must give the same values.
    import zlib

    from agentgym.protocol.weights import crc32

    rng = np.random.default_rng(5)
    for n in (0, 1, 7, 4096, 1_000_003):
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        assert crc32(data) == zlib.crc32(data)
        assert crc32(memoryview(data)[1:]) == zlib.crc32(data[1:])


def test_versions_exported_into_kept_buffers_arrive_exact_while_older_ones_are_still_held() -> None:
    # Versions 1..4 through a real hub: each export writes into buffers the exporter kept, never
    # into one a snapshot still served, or a fetch still held, reads.
    port = free_port_pair()
    rng = np.random.default_rng(8)
    exporter = WeightExporter(chunk_bytes=16_000)

    def tensors(version: int) -> dict[str, np.ndarray]:
        return {
            f"layer{i}.weight": np.full((50, 30), version * 10 + i, np.float32) + rng.random((50, 30), np.float32)
            for i in range(6)
        }

    with HubThread(f"tcp://127.0.0.1:{port}") as ht:

        async def client() -> None:
            ctx = zmq.asyncio.Context()
            held = []  # the learner side's snapshots stay alive here too, as a slow actor's sends would
            for version in range(1, 5):
                arrays = tensors(version)
                chunks, cv = exporter.build(
                    version, [RawTensor(k, "float32", v.shape, v.tobytes()) for k, v in arrays.items()]
                )
                snap = WeightSnapshot.build(version, chunks)
                if version == 2:
                    held.append(snap)  # version 2's buffers stay in use: never written by 3 or 4
                del chunks
                ht.commands.put(lambda hub, s=snap: hub.publish_weights(s))
                del snap
                await asyncio.sleep(0.2)
                ready = WeightsReady(
                    version=version, step=version, turn_limit=3, num_chunks=len(cv), total_bytes=0, chunk_versions=cv
                )
                got, raw = await fetch_weights(ctx, f"tcp://127.0.0.1:{port + 1}", ready)
                assert got == version
                assert all(
                    np.array_equal(np.frombuffer(t.data, np.float32).reshape(t.shape), arrays[t.name]) for t in raw
                )
            # version 2 as it was, though two versions were exported after it
            asm = Assembler()
            for frames in held[0].frames:
                msg, data = decode(frames)
                verify_chunk(msg, data[0])
                asm.add(msg, data[0])
            assert all(
                np.frombuffer(t.data, np.float32).min() >= 20 and np.frombuffer(t.data, np.float32).max() < 27
                for t in asm.finish()
            )
            assert exporter.buffers.reused > 0  # versions 3 and 4 wrote into buffers kept from 1 (and 3's)
            ctx.term()

        asyncio.run(asyncio.wait_for(client(), 60))


def test_an_actors_fetches_land_in_buffers_it_keeps_and_no_frame_outlives_its_chunk() -> None:
    import gc

    from agentgym.protocol.weights import WeightBuffers

    whole = np.arange(100, dtype=np.float32)
    split = np.arange(300, dtype=np.float32)
    chunks = make_chunks(
        5,
        [
            RawTensor("whole", "float32", (100,), whole.tobytes()),
            RawTensor("split", "float32", (300,), split.tobytes()),
        ],
        1000,
    )
    kept = WeightBuffers()
    frames = [bytearray(d) for _, d in chunks]
    asm = Assembler(into=kept)
    for (msg, _), frame in zip(chunks, frames, strict=True):
        asm.add(msg, frame)
    got = {t.name: t.data for t in asm.finish()}
    frames[0][0] ^= 0xFF  # a copy, not a view into the frame
    assert np.array_equal(np.frombuffer(got["whole"], np.float32), whole)
    assert np.array_equal(np.frombuffer(got["split"], np.float32), split)
    assert kept.nbytes == 1600 and _address(got["whole"]) == _address(kept.get("whole", 400))

    # Through a real hub, three versions into the same buffers: the same memory every time.
    port = free_port_pair()
    arrays = {f"layer{i}.weight": np.zeros((64, 32), np.float32) for i in range(5)}
    with HubThread(f"tcp://127.0.0.1:{port}") as ht:

        async def client() -> None:
            ctx = zmq.asyncio.Context()
            kept = WeightBuffers()
            where = None
            for version in (1, 2, 3):
                for i, a in enumerate(arrays.values()):
                    a[:] = version * 100 + i
                chunks = make_chunks(
                    version, [RawTensor(k, "float32", v.shape, v.tobytes()) for k, v in arrays.items()], 20_000
                )
                snap = WeightSnapshot.build(version, chunks)
                ht.commands.put(lambda hub, s=snap: hub.publish_weights(s))
                await asyncio.sleep(0.2)
                ready = WeightsReady(
                    version=version, step=version, turn_limit=3, num_chunks=len(chunks), total_bytes=snap.total_bytes
                )
                _, raw = await fetch_weights(ctx, f"tcp://127.0.0.1:{port + 1}", ready, into=kept)
                assert {t.name: np.frombuffer(t.data, np.float32).reshape(t.shape)[0, 0] for t in raw} == {
                    k: version * 100 + i for i, k in enumerate(arrays)
                }
                here = {t.name: _address(t.data) for t in raw}
                assert where is None or here == where  # no new memory after the first fetch
                where = here
                assert all(not t.data.readonly for t in raw)  # buffers of the actor's own, not frames
            gc.collect()
            # the last version's tensors are still held, and no received frame is: each was let go
            # once copied (without kept buffers, tensors whole in a chunk keep their frames alive)
            assert raw and not [o for o in gc.get_objects() if issubclass(type(o), zmq.Frame)]
            ctx.term()

        asyncio.run(asyncio.wait_for(client(), 60))
