"""A Qwen2.5-0.5B-shape weight update through the production path, over real sockets:
``agentgym make-model`` -> learner Trainer -> export (bfloat16) -> WeightExporter chunks ->
the learner's hub -> the actor's fetch_weights (assembled into buffers) -> engine load; the
engine then holds exactly the learner's weights. About 4 GiB of memory, a minute on 2 cores."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import zmq.asyncio  # noqa: E402
from test_transport import HubThread  # noqa: E402

from agentgym.actors.engines.hf_engine import HfEngine  # noqa: E402
from agentgym.actors.weight_fetch import fetch_weights, to_torch  # noqa: E402
from agentgym.config import load_config  # noqa: E402
from agentgym.host.netutil import free_port_pair  # noqa: E402
from agentgym.learner.training.distributed import DataParallel  # noqa: E402
from agentgym.learner.training.trainer import Trainer  # noqa: E402
from agentgym.learner.training.weight_export import WeightExporter  # noqa: E402
from agentgym.learner.transport import WeightSnapshot  # noqa: E402
from agentgym.models.make import make_model  # noqa: E402
from agentgym.protocol import WeightsReady  # noqa: E402


def test_a_half_billion_parameter_update_reaches_the_engine_exactly(tmp_path: Path) -> None:
    model_dir = make_model("qwen2.5-0.5b", tmp_path / "q05", seed=0)
    cfg = load_config(None, [f'model.path="{model_dir}"', 'model.dtype="bfloat16"', "learner.weight_chunk_mib=64"])
    trainer = Trainer.build(cfg, DataParallel())
    with torch.no_grad():  # a "trained" model: every weight moves
        for p in trainer.model.parameters():
            p.add_(0.0625)
    chunks, chunk_versions = WeightExporter(64 << 20).build(1, trainer.export_weights("bfloat16"))
    snap = WeightSnapshot.build(1, chunks)
    assert snap.total_bytes == 494_032_768 * 2  # tied embedding sent once
    assert max(len(d) for _, d in chunks) <= 64 << 20
    # 15 chunks would hold it packed tight; a tensor that fits a chunk is never split, so 16
    spans = [m.name for msg, _ in chunks for m in msg.tensors]
    assert len(chunks) == 16 and {n for n in spans if spans.count(n) > 1} == {"model.embed_tokens.weight"}
    del chunks
    port = free_port_pair()

    async def actor_side() -> dict[str, torch.Tensor]:
        ctx = zmq.asyncio.Context()
        try:
            await asyncio.sleep(0.5)  # the hub thread publishes first
            ready = WeightsReady(
                version=1,
                step=1,
                turn_limit=3,
                num_chunks=len(snap.frames),
                total_bytes=snap.total_bytes,
                chunk_versions=chunk_versions,
            )
            version, raw = await fetch_weights(ctx, f"tcp://127.0.0.1:{port + 1}", ready)
            assert version == 1
            engine = HfEngine(model_dir, seed=0, dtype="bfloat16")
            await engine.start()
            try:
                await engine.update_weights(to_torch(raw), version)
                assert engine.version == 1
                return {k: v.clone() for k, v in engine.model.state_dict().items()}
            finally:
                await engine.close()
        finally:
            ctx.term()

    with HubThread(f"tcp://127.0.0.1:{port}") as ht:
        ht.commands.put(lambda hub: hub.publish_weights(snap))
        loaded = asyncio.run(asyncio.wait_for(actor_side(), 240))
    learner = trainer.model.state_dict()
    assert loaded.keys() == learner.keys()
    for name, t in learner.items():  # the learner's float32 master weights, rounded to the wire's bfloat16
        assert t.dtype == torch.float32 and torch.equal(loaded[name], t.to(torch.bfloat16)), name
