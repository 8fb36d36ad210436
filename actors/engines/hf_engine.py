"""The reference engine: plain ``transformers``, one forward pass per token, exact float32 logprobs.

    engine = HfEngine(Path("models/tiny"), seed=0)
    await engine.start()                       # loads the model (a second for the tiny one)
    gen = await engine.generate("g/0/0", prompt_ids, SamplingSpec(max_tokens=32))
    await engine.update_weights(tensors, version=1)
    await engine.close()

Why it exists (docs/adr/0008-engines.md): it is what every engine's logprobs and samplers are
checked against in the shared engine tests, it runs wherever ``transformers`` does (no vLLM
wheel for the platform, a debugger, a notebook), it starts in about a second, and its weight
update is a ``copy_`` into the live parameters. It is not fast: requests run one token at a
time on one worker thread (requests interleave token by token, without batching), so it is a
fallback and a reference, never the production engine.

Sampling is vLLM's, written out: ``logp = log_softmax(logits / T)``; with ``top_p < 1`` the
distribution is cut to the smallest nucleus with mass >= top_p and renormalized; the token is
drawn from it and its logprob in that distribution is the behaviour logprob. ``T = 0`` is
greedy with the unscaled log-softmax (what vLLM reports there). A request stops on its
``stop_token_ids``, on the model's end-of-sequence ids (as vLLM does unless told otherwise), at
``max_tokens`` or at ``max_model_len``; the stop token is part of the output.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from agentgym.actors.engines.engine import (
    EngineLoad,
    FinishReason,
    GatedEngine,
    Generation,
    SamplingSpec,
    UpdateMode,
    safetensors_files,
    tensor_bytes,
)
from agentgym.protocol.weights import tensor_digest, weights_digest

if TYPE_CHECKING:
    import torch

log = structlog.get_logger(__name__)

_DTYPES = ("float32", "bfloat16", "float16")


class HfEngine(GatedEngine):
    """``InferenceEngine`` over a ``transformers`` causal LM with a per-request KV cache."""

    partial_updates = True  # copies any subset of named tensors in place

    def __init__(
        self,
        model_dir: Path,
        *,
        seed: int,
        dtype: str = "float32",
        device: str = "cpu",
        max_model_len: int = 2048,
        kv_capacity_tokens: int = 1 << 16,
        update_mode: UpdateMode = "resume",
    ) -> None:
        super().__init__(update_mode)
        self.model_dir = Path(model_dir)
        if not (self.model_dir / "config.json").is_file():
            raise FileNotFoundError(f"HfEngine: {self.model_dir} has no config.json (not an HF model directory)")
        if dtype not in _DTYPES:
            raise ValueError(f"HfEngine: dtype must be one of {_DTYPES}, got {dtype!r}")
        if device not in ("auto", "cpu", "cuda") and not device.startswith("cuda:"):
            raise ValueError(f"HfEngine: device must be auto, cpu, cuda or cuda:N, got {device!r}")
        if max_model_len < 2 or kv_capacity_tokens < 1:
            raise ValueError(f"HfEngine: max_model_len={max_model_len} must be >= 2 and kv_capacity_tokens >= 1")
        self.seed, self.dtype, self.device = seed, dtype, device
        self.max_model_len = max_model_len
        self.kv_capacity_tokens = kv_capacity_tokens
        """What ``load().kv_cache_usage`` divides by (this engine has no fixed KV pool)."""
        self.model: Any = None
        self._eos: set[int] = set()
        self._pool: ThreadPoolExecutor | None = None
        self._stop: dict[str, bool] = {}  # segment id -> abort asked
        self._cached: dict[str, int] = {}  # segment id -> tokens in its KV cache
        self._rng = random.Random(seed)

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        if self.model is not None:
            raise RuntimeError("HfEngine.start: already started")
        t0 = time.monotonic()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hf-engine")
        try:
            self.model, self._eos = await self._run(self._load_model)
        except BaseException:
            self._pool.shutdown(wait=False)
            self._pool = None
            raise
        log.info(
            "engine_started",
            engine="hf",
            model=str(self.model_dir),
            dtype=self.dtype,
            device=self.device,
            seconds=round(time.monotonic() - t0, 1),
        )

    def _load_model(self) -> tuple[Any, set[int]]:
        import torch
        from transformers import AutoModelForCausalLM, GenerationConfig

        if self.device == "auto":
            self.device = "cuda" if torch.cuda.is_available() else "cpu"
        elif self.device.startswith("cuda") and not torch.cuda.is_available():
            raise RuntimeError(f"HfEngine: device {self.device!r} asked for, but torch sees no CUDA device")
        model = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=getattr(torch, self.dtype))
        model = model.to(self.device).eval()  # type: ignore[arg-type]  # transformers' wrapper on .to hides torch's signature
        eos: set[int] = set()
        sources: list[Any] = [model.config.eos_token_id]
        try:
            sources.append(GenerationConfig.from_pretrained(self.model_dir).eos_token_id)
        except OSError:  # no generation_config.json
            pass
        for ids in sources:
            eos.update([ids] if isinstance(ids, int) else list(ids or []))
        return model, eos

    async def close(self) -> None:
        if self.model is None:
            return
        for req in self._requests.values():
            req.aborted = True
        for seg in self._stop:
            self._stop[seg] = True
        self._gate.wake()
        while self._requests:  # each running request leaves after its current token
            await asyncio.sleep(0.005)
        pool, self._pool, self.model = self._pool, None, None
        if pool is not None:
            pool.shutdown(wait=True)
        log.info("engine_closed", engine="hf")

    def _require(self) -> Any:
        if self.model is None or self._pool is None:
            raise RuntimeError("HfEngine: not started (call `await engine.start()` first) or already closed")
        return self.model

    async def _run(self, fn: Any, *args: Any) -> Any:
        if self._pool is None:
            raise RuntimeError("HfEngine: not started (call `await engine.start()` first) or already closed")
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    # ------------------------------------------------------------------ backend half (GatedEngine)
    def _check_prompt(self, request_id: str, prompt_ids: list[int]) -> None:
        super()._check_prompt(request_id, prompt_ids)
        model = self._require()
        if len(prompt_ids) >= self.max_model_len:
            raise ValueError(
                f"HfEngine.generate({request_id!r}): prompt of {len(prompt_ids)} tokens does not fit "
                f"max_model_len={self.max_model_len}"
            )
        vocab = model.config.vocab_size
        bad = [t for t in prompt_ids if not 0 <= int(t) < vocab]
        if bad:
            raise ValueError(
                f"HfEngine.generate({request_id!r}): token ids {bad[:5]} outside the vocabulary [0, {vocab})"
            )

    async def _generate(self, segment_id: str, prompt_ids: list[int], spec: SamplingSpec) -> Generation:
        import torch

        model = self._require()
        seed = spec.seed if spec.seed is not None else self._rng.randrange(2**63)
        gen = torch.Generator(device="cpu").manual_seed(seed)
        stop = set(spec.stop_token_ids) | self._eos
        budget = min(spec.max_tokens, self.max_model_len - len(prompt_ids))
        state: dict[str, Any] = {"cache": None, "next": list(prompt_ids)}
        ids: list[int] = []
        logprobs: list[float] = []
        self._stop[segment_id] = False
        self._cached[segment_id] = 0
        finish: FinishReason = "length"
        try:
            while len(ids) < budget:
                if self._stop[segment_id]:
                    finish = "abort"
                    break
                tok, lp = await self._run(self._step, model, state, spec, gen)
                self._cached[segment_id] += len(state["next"])
                state["next"] = [tok]
                ids.append(tok)
                logprobs.append(lp)
                if tok in stop:
                    finish = "stop"
                    break
        finally:
            del self._stop[segment_id], self._cached[segment_id]
        return Generation(ids, logprobs, self.version, finish)

    @staticmethod
    def _step(model: Any, state: dict[str, Any], spec: SamplingSpec, gen: torch.Generator) -> tuple[int, float]:
        import torch
        from transformers import DynamicCache

        with torch.inference_mode():
            if state["cache"] is None:
                state["cache"] = DynamicCache(config=model.config)
            x = torch.tensor([state["next"]], device=model.device)
            out = model(input_ids=x, past_key_values=state["cache"], use_cache=True)
            state["cache"] = out.past_key_values
            return sample(out.logits[0, -1].float().cpu(), spec.temperature, spec.top_p, gen, spec.banned_token_ids)

    async def _abort(self, segment_id: str) -> None:
        if segment_id in self._stop:
            self._stop[segment_id] = True

    def load(self) -> EngineLoad:
        running, waiting = self._in_flight()
        return EngineLoad(running, waiting, min(1.0, sum(self._cached.values()) / self.kv_capacity_tokens))

    # ------------------------------------------------------------------ weights
    async def _prepare_weights(self, tensors: Mapping[str, torch.Tensor] | Path) -> object:
        """Files are read here, outside the gate: a bad path fails before anything pauses."""
        self._require()
        if isinstance(tensors, (str, Path)):
            return await asyncio.to_thread(_read_safetensors, Path(tensors))
        return tensors

    async def _load_weights(self, prepared: object) -> int:
        model = self._require()
        return await self._run(_copy_weights, model, prepared)

    async def _served_digest(self, tensors: Mapping[str, torch.Tensor] | Path) -> tuple[int, int]:
        """The digest of the parameters as the model holds them now, read back for the names
        the update loaded (in the dtype they came in): a tensor skipped or mis-copied shows."""
        if not isinstance(tensors, Mapping):
            return -1, 0
        return await self._run(_read_back_digest, self._require(), {n: t.dtype for n, t in tensors.items()})


def sample(
    logits: torch.Tensor, temperature: float, top_p: float, gen: torch.Generator, banned: tuple[int, ...] = ()
) -> tuple[int, float]:
    """One token from float32 ``logits`` [V] and its logprob in the distribution it came from
    (``banned`` ids at probability 0, as the learner scores them: protocol/vocab.py)."""
    import torch

    if banned:
        logits = logits.index_fill(0, torch.tensor(banned, dtype=torch.long), float("-inf"))

    if temperature == 0:
        logp = torch.log_softmax(logits, dim=-1)
        tok = int(torch.argmax(logits))
        return tok, float(logp[tok])
    logp = torch.log_softmax(logits / temperature, dim=-1)
    if top_p < 1:
        p, order = torch.sort(logp.exp(), descending=True)
        # Keep a token while the mass before it is below top_p: the smallest such nucleus.
        drop = (torch.cumsum(p, 0) - p) >= top_p
        cut = torch.zeros_like(logp, dtype=torch.bool)
        cut[order[drop]] = True
        logp = torch.log_softmax(logp.masked_fill(cut, float("-inf")), dim=-1)
    tok = int(torch.multinomial(logp.exp(), 1, generator=gen))
    return tok, float(logp[tok])


def _copy_weights(model: Any, tensors: Mapping[str, torch.Tensor] | Path) -> int:
    """Copy HF-named tensors (or a safetensors dir/file) into the live parameters, checked."""
    import torch

    if isinstance(tensors, (str, Path)):
        tensors = _read_safetensors(Path(tensors))
    if not tensors:
        raise ValueError("HfEngine.update_weights: no tensors given")
    params = model.state_dict()
    unknown = sorted(set(tensors) - set(params))
    if unknown:
        raise KeyError(f"HfEngine.update_weights: the model has no tensors named {unknown[:5]}")
    for name, t in tensors.items():
        if tuple(t.shape) != tuple(params[name].shape):
            raise ValueError(
                f"HfEngine.update_weights: {name} has shape {tuple(t.shape)}, "
                f"the model's is {tuple(params[name].shape)}"
            )
    with torch.no_grad():
        for name, t in tensors.items():
            params[name].copy_(t.to(params[name].device, params[name].dtype))
    return len(tensors)


def _read_back_digest(model: Any, dtypes: Mapping[str, Any]) -> tuple[int, int]:
    params = model.state_dict()
    terms = [tensor_digest(n, tensor_bytes(params[n].to(dt))) for n, dt in dtypes.items() if n in params]
    return weights_digest(terms), len(terms)


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for f in safetensors_files(path, "HfEngine.update_weights"):
        out.update(load_file(str(f)))
    return out
