"""The simulated engine (actors/engines/sim_engine.py): the real gate around a fake model.

Asserted: token ids, logprobs and per-token versions as the engine contract says; a weight
update in resume mode splits a request's versions at the update and a seeded request samples the
same tokens with or without the interruption; drain mode keeps one version per generation;
aborts end requests; loaded bytes are remembered by crc32 (bfloat16 included); the config
chooses it. No wall times asserted.
"""

from __future__ import annotations

import asyncio
import json
import zlib
from pathlib import Path

import pytest
import torch

from agentgym.actors.engines.builders import make_engine
from agentgym.actors.engines.engine import SamplingSpec
from agentgym.actors.engines.sim_engine import SimEngine
from agentgym.config import Config


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_tokens_logprobs_and_versions_follow_the_engine_contract() -> None:
    async def scenario() -> None:
        eng = SimEngine(vocab_size=50, tokens_per_s=5000, latency_s=0.0, seed=1)
        await eng.start()
        gen = await eng.generate("r", [1, 2, 3], SamplingSpec(max_tokens=40))
        assert len(gen.token_ids) == 40 and gen.finish_reason == "length"
        assert all(0 <= t < 50 for t in gen.token_ids)
        assert all(-4.0 < lp <= 0.0 for lp in gen.logprobs)
        assert gen.versions == [0] * 40
        stopped = await eng.generate("s", [1], SamplingSpec(max_tokens=2000, stop_token_ids=(7,)))
        assert stopped.finish_reason == "stop" and stopped.token_ids[-1] == 7 and len(stopped.token_ids) < 2000
        with pytest.raises(ValueError, match="empty prompt"):
            await eng.generate("e", [], SamplingSpec(max_tokens=1))
        await eng.close()

    run(scenario())


def test_an_update_in_resume_mode_splits_versions_and_keeps_a_seeded_stream() -> None:
    async def scenario() -> None:
        spec = SamplingSpec(max_tokens=60, seed=123)
        quiet = SimEngine(tokens_per_s=400, latency_s=0.0)
        await quiet.start()
        reference = await quiet.generate("a", [5, 6], spec)

        eng = SimEngine(tokens_per_s=400, latency_s=0.0)
        await eng.start()
        task = asyncio.create_task(eng.generate("a", [5, 6], spec))
        while eng.tokens_generated == 0 and not eng._stop:  # running, before its first token
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.05)
        await eng.update_weights({"w": b"\x01\x02"}, version=1)
        gen = await task
        assert gen.token_ids == reference.token_ids  # the same tokens, interrupted or not
        assert len(gen.versions) == 60 and gen.versions[0] == 0 and gen.versions[-1] == 1
        cut = gen.versions.index(1)
        assert 0 < cut < 60 and gen.versions == [0] * cut + [1] * (60 - cut)
        assert eng.resumed_segments == 1 and eng.version == 1

    run(scenario())


def test_drain_mode_keeps_one_version_per_generation_and_abort_ends_requests() -> None:
    async def scenario() -> None:
        eng = SimEngine(tokens_per_s=500, latency_s=0.0, update_mode="drain")
        await eng.start()
        task = asyncio.create_task(eng.generate("a", [1], SamplingSpec(max_tokens=30)))
        await asyncio.sleep(0.01)
        await eng.update_weights({"w": b"x"}, version=2)  # waits for the request
        gen = await task
        assert gen.versions == [0] * 30 and eng.version == 2

        long = asyncio.create_task(eng.generate("b", [1], SamplingSpec(max_tokens=100_000)))
        await asyncio.sleep(0.05)
        assert eng.load().running == 1
        await eng.abort("b")
        out = await long
        assert out.finish_reason == "abort" and len(out.token_ids) < 100_000
        assert eng.load().running == 0

    run(scenario())


def test_loaded_tensors_are_remembered_by_crc32_and_versions_only_move_forward() -> None:
    async def scenario() -> None:
        eng = SimEngine()
        await eng.start()
        t = torch.arange(12, dtype=torch.bfloat16).reshape(3, 4)
        await eng.update_weights({"a": t, "b": bytearray(b"hello")}, version=1)
        assert eng.digests == {"a": zlib.crc32(t.view(torch.uint8).numpy().tobytes()), "b": zlib.crc32(b"hello")}
        await eng.update_weights({"b": b"world"}, version=2)  # a subset: "a" unchanged
        assert eng.digests["b"] == zlib.crc32(b"world") and "a" in eng.digests
        await eng.update_weights({}, version=3)  # changed-only, nothing changed: the number moves
        assert eng.version == 3
        with pytest.raises(ValueError, match="older than the loaded 3"):
            await eng.update_weights({"b": b"x"}, version=2)
        with pytest.raises(TypeError, match="named tensors"):
            await eng.update_weights(Path("/nonexistent"), version=4)

    run(scenario())


def test_the_config_chooses_it_with_the_models_vocabulary(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 77, "max_position_embeddings": 64}))
    cfg = Config.model_validate({"actor": {"engine": "sim", "sim": {"tokens_per_s": 1000, "latency_s": 0.5}}})
    eng = make_engine(cfg, tmp_path)
    assert isinstance(eng, SimEngine) and eng.vocab_size == 77 and eng.latency_s == 0.5 and eng.partial_updates
    with pytest.raises(ValueError, match="tokens_per_s"):
        Config.model_validate({"actor": {"engine": "sim", "sim": {"tokens_per_s": 0}}})
    no_vocab = Config.model_validate({"actor": {"engine": "sim", "max_model_len": 64}})
    with pytest.raises(ValueError, match="actor.sim.vocab_size is unset"):
        make_engine(no_vocab, tmp_path / "no-model-here")
