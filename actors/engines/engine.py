"""The inference engine interface: tokens in, tokens + behaviour logprobs out, versioned weights.

    engine: InferenceEngine = VllmEngine(model_dir, seed=0)      # actors/engines/vllm_engine.py
    await engine.start()
    gen = await engine.generate("group/0/turn/0", prompt_ids, SamplingSpec(max_tokens=32))
    gen.token_ids, gen.logprobs, gen.versions, gen.finish_reason
    await engine.update_weights({"model.embed_tokens.weight": t, ...}, version=1)
    await engine.close()

Everything the rollout code needs from an engine is here. Engines: ``VllmEngine``
(actors/engines/vllm_engine.py), ``RemoteEngine`` (an OpenAI-compatible server, actors/engines/remote_engine.py)
and ``HfEngine`` (plain ``transformers``, the reference, actors/engines/hf_engine.py); each implements
the backend half of ``GatedEngine`` below and inherits the request bookkeeping.

Contract:
- ``Generation.logprobs[i]`` is the log-probability of ``token_ids[i]`` under the distribution
  the engine actually sampled from: ``log_softmax(logits / temperature)`` (renormalized over
  the nucleus when ``top_p < 1``). That is what the learner recomputes for importance weights.
- Versions: every token carries the version of the weights that sampled it
  (``Generation.versions``). ``update_weights`` never drops a request. With
  ``update_mode="resume"`` (the default) it aborts the requests in flight, loads, and each of
  them continues from the tokens it already has (prompt + partial output, prefilled again with
  the new weights): tokens before the update carry the old version, tokens after it the new
  one, and every logprob is that of the weights its token's version names. With
  ``update_mode="drain"`` the update waits for the requests in flight to finish while new ones
  wait for it, so one ``Generation`` has one version. docs/engines.md compares the two.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

import structlog

from agentgym.protocol.weights import tensor_digest, weights_digest

if TYPE_CHECKING:
    import torch

log = structlog.get_logger(__name__)

FinishReason = Literal["stop", "length", "abort"]
UpdateMode = Literal["resume", "drain"]


@dataclass(frozen=True)
class SamplingSpec:
    """How to sample one agent turn."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    banned_token_ids: tuple[int, ...] = ()
    """Ids sampled with probability 0 (the logprobs are of the distribution without them)."""

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"SamplingSpec.max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"SamplingSpec.temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingSpec.top_p must be in (0, 1], got {self.top_p}")


@dataclass(frozen=True)
class Generation:
    """One sampled turn: the tokens, their behaviour logprobs and weight versions.

    ``version`` is the version of the last token (the engine's version for an empty turn);
    ``versions`` has one entry per token and defaults to ``version`` for all of them."""

    token_ids: list[int]
    logprobs: list[float]
    version: int
    finish_reason: FinishReason
    versions: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(f"Generation: {len(self.token_ids)} token ids but {len(self.logprobs)} logprobs")
        if not self.versions:
            object.__setattr__(self, "versions", [self.version] * len(self.token_ids))
        elif len(self.versions) != len(self.token_ids):
            raise ValueError(f"Generation: {len(self.token_ids)} token ids but {len(self.versions)} versions")


@dataclass(frozen=True)
class EngineLoad:
    """How busy an engine is (for scheduling and metrics)."""

    running: int
    waiting: int
    kv_cache_usage: float


@runtime_checkable
class InferenceEngine(Protocol):
    """What an actor needs from an inference engine."""

    version: int
    """Weight version of the weights loaded now (0: the model directory's own weights)."""

    async def start(self) -> None:
        """Load the model and start serving; returns when ``generate`` can be called."""

    async def generate(self, request_id: str, prompt_ids: list[int], spec: SamplingSpec) -> Generation:
        """Sample one continuation of ``prompt_ids``; ``request_id`` must be unique in flight."""

    async def update_weights(self, tensors: Mapping[str, torch.Tensor] | Path, version: int) -> None:
        """Load named tensors (HF names) or a directory of ``*.safetensors``; then ``version``.

        ``version`` must not be older than the loaded one; the same version is allowed (an actor
        whose own model directory is not the learner's replaces those weights with the
        learner's version 0 before it plays). The tensors are the actor's fetch buffers, which the
        next fetch overwrites (protocol/weights.py, ``WeightBuffers``): copy what is kept, keep
        no reference to them once this returns."""

    async def abort(self, request_id: str) -> None:
        """Stop a request in flight; its ``generate`` returns with ``finish_reason="abort"``."""

    def load(self) -> EngineLoad:
        """Current load, without waiting."""

    async def close(self) -> None:
        """Stop serving and release every process and resource the engine started."""


class GateAbandoned(Exception):
    """A reader gave up waiting at the gate (its ``give_up`` predicate became true)."""


class VersionGate:
    """A reader/writer gate on an asyncio loop: requests read, weight updates write.

    Any number of readers hold the gate together; a writer holds it alone. A waiting writer
    blocks new readers (writer preference), so an update is delayed only by the requests
    already in flight, never starved by new ones. State changes are synchronous, so a
    cancelled reader or writer always leaves the counters right.
    """

    def __init__(self) -> None:
        self.readers = 0
        self.writing = False
        self.writers_waiting = 0
        self.readers_waiting = 0
        self._changed = asyncio.Event()

    def wake(self) -> None:
        """Make every waiter re-check its condition (after a ``give_up`` predicate changed)."""
        self._changed.set()
        self._changed = asyncio.Event()

    _notify = wake

    async def _wait_until(self, ready: Callable[[], bool]) -> None:
        while not ready():
            await self._changed.wait()

    @asynccontextmanager
    async def read(self, give_up: Callable[[], bool] | None = None) -> AsyncIterator[None]:
        """Hold the gate as a reader; raises ``GateAbandoned`` if ``give_up()`` turns true first."""
        free = lambda: not self.writing and not self.writers_waiting  # noqa: E731
        self.readers_waiting += 1
        try:
            await self._wait_until(lambda: free() or (give_up is not None and give_up()))
        finally:
            self.readers_waiting -= 1
        if not free():
            raise GateAbandoned
        self.readers += 1
        try:
            yield
        finally:
            self.readers -= 1
            self._notify()

    @asynccontextmanager
    async def write(self, on_wait: Callable[[], None] | None = None) -> AsyncIterator[None]:
        """Hold the gate alone. ``on_wait`` runs once new readers are held back (synchronously,
        before waiting), so it can ask the readers inside to leave early."""
        self.writers_waiting += 1
        try:
            if on_wait is not None:
                on_wait()
            await self._wait_until(lambda: not self.writing and self.readers == 0)
        except BaseException:
            self.writers_waiting -= 1
            self._notify()  # readers held back by this writer may go
            raise
        self.writers_waiting -= 1
        self.writing = True
        try:
            yield
        finally:
            self.writing = False
            self._notify()


class _Request:
    __slots__ = ("segment_id", "running", "aborted", "preempted")

    def __init__(self) -> None:
        self.segment_id = ""  # the backend's id for the part running now
        self.running = False
        self.aborted = False  # by the caller: ends the request
        self.preempted = False  # by a weight update: the request continues after it


class GatedEngine:
    """Request bookkeeping shared by every engine: versions, aborts, updates that drop nothing.

    A backend implements ``start``, ``load`` and ``close`` (``InferenceEngine``'s),
    ``_generate(segment_id, prompt_ids, spec)`` (one uninterrupted run;
    returns ``finish_reason="abort"`` with the tokens so far when ``_abort(segment_id)`` stops
    it), ``_abort``, ``_load_weights(prepared)`` (with nothing running) and optionally
    ``_prepare_weights(tensors)`` (outside the gate: e.g. write a file while generation goes on).

    ``update_mode="resume"``: an update aborts the running segments; each request then waits
    at the gate and continues as a new segment with prompt = prompt + tokens so far,
    ``max_tokens`` reduced by them and a seed shifted by them (same seed, same tokens, in a
    run without updates). The new segment is prefilled with the new weights, so the tokens
    after the update are exactly what a fresh engine with the new weights samples from that
    prefix. ``update_mode="drain"``: the update waits for the segments in flight to finish.
    """

    partial_updates: bool = False
    """True if ``update_weights`` accepts a subset of the model's tensors (the rest unchanged);
    the actor then fetches only the tensors changed since its version (protocol/weights.py)."""

    def __init__(self, update_mode: UpdateMode = "resume") -> None:
        if update_mode not in ("resume", "drain"):
            raise ValueError(f"{type(self).__name__}: update_mode must be 'resume' or 'drain', got {update_mode!r}")
        self.update_mode: UpdateMode = update_mode
        self.version = 0
        self.resumed_segments = 0
        self.sampled_tokens = 0
        """Tokens every segment returned (an aborted one's too): what this engine sampled; a
        leaving actor's lost tokens are these less those it sent and handed over."""
        self.weights_digest = -1
        """Flight recorder: ``protocol.weights.weights_digest`` of the tensors the last update
        loaded, as this engine serves them (read back where the engine allows; else as handed
        to it); -1: not known (a load from files). ``digest_tensors``: how many it covers."""
        self.digest_tensors = 0
        self.last_update: dict[str, float] = {}
        """Seconds of the last update: prepare (outside the pause), drain and load (the pause)."""
        """Segments restarted after an update (resume mode), for metrics."""
        self._gate = VersionGate()
        self._requests: dict[str, _Request] = {}
        self._aborts: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------ backend half
    async def _generate(self, segment_id: str, prompt_ids: list[int], spec: SamplingSpec) -> Generation:
        raise NotImplementedError

    async def _abort(self, segment_id: str) -> None:
        raise NotImplementedError

    async def _prepare_weights(self, tensors: Mapping[str, torch.Tensor] | Path) -> object:
        return tensors

    async def _load_weights(self, prepared: object) -> int:
        """Load in place (nothing runs meanwhile); returns how many tensors were loaded."""
        raise NotImplementedError

    async def start(self) -> None:
        raise NotImplementedError

    def load(self) -> EngineLoad:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError

    def _check_prompt(self, request_id: str, prompt_ids: list[int]) -> None:
        if not prompt_ids:
            raise ValueError(f"{type(self).__name__}.generate({request_id!r}): empty prompt")

    # ------------------------------------------------------------------ interface
    async def generate(self, request_id: str, prompt_ids: list[int], spec: SamplingSpec) -> Generation:
        self._check_prompt(request_id, prompt_ids)
        if request_id in self._requests:
            raise ValueError(f"{type(self).__name__}.generate: request id {request_id!r} is already in flight")
        req = self._requests[request_id] = _Request()
        ids: list[int] = []
        logprobs: list[float] = []
        versions: list[int] = []
        finish: FinishReason = "abort"
        segment = 0
        try:
            while not req.aborted:
                async with self._gate.read(give_up=lambda: req.aborted):
                    if req.aborted:
                        break
                    version = self.version  # fixed while this segment runs: updates wait for readers
                    req.segment_id = request_id if segment == 0 else f"{request_id}@{segment}"
                    req.preempted, req.running = False, True
                    part = replace(
                        spec,
                        max_tokens=spec.max_tokens - len(ids),
                        seed=None if spec.seed is None else spec.seed + len(ids),
                    )
                    try:
                        out = await self._generate(req.segment_id, list(prompt_ids) + ids, part)
                    finally:
                        req.running = False
                ids += out.token_ids
                self.sampled_tokens += len(out.token_ids)
                logprobs += out.logprobs
                versions += [version] * len(out.token_ids)
                finish = out.finish_reason
                if finish != "abort" or req.aborted or not req.preempted:
                    break
                if len(ids) >= spec.max_tokens:  # stopped by the update right at its last token
                    finish = "length"
                    break
                segment += 1
                self.resumed_segments += 1
        except GateAbandoned:
            finish = "abort"
        finally:
            del self._requests[request_id]
        if req.aborted:
            finish = "abort"
        return Generation(ids, logprobs, versions[-1] if versions else self.version, finish, versions)

    async def abort(self, request_id: str) -> None:
        req = self._requests.get(request_id)
        if req is None:
            return  # unknown or finished: nothing to do
        req.aborted = True
        if req.running:
            await self._abort(req.segment_id)
        else:
            self._gate.wake()  # waiting at the gate: it returns "abort" without running

    def _preempt(self) -> None:
        """Ask every running segment to stop (the update holds new ones back meanwhile)."""
        for req in self._requests.values():
            if req.running and not req.aborted:
                req.preempted = True
                task = asyncio.ensure_future(self._abort(req.segment_id))
                self._aborts.add(task)
                task.add_done_callback(self._aborts.discard)

    async def update_weights(self, tensors: Mapping[str, torch.Tensor] | Path, version: int) -> None:
        """Load new weights in place, then ``version``; requests in flight are resumed or drained.

        ``tensors``: HF-named tensors (as ``model.state_dict()`` names them; any subset), or a
        directory of ``*.safetensors`` files (or one such file)."""
        name = type(self).__name__
        if version < self.version:
            raise ValueError(f"{name}.update_weights: version {version} is older than the loaded {self.version}")
        if isinstance(tensors, Mapping) and not tensors and self.partial_updates:
            # A changed-only fetch of a version in which no tensor changed (a zero-gradient step,
            # every advantage 0): the weights held are that version's, so only the number moves.
            self.version = version
            self.last_update = {"prepare_s": 0.0, "drain_s": 0.0, "load_s": 0.0}
            log.info("engine_weights_unchanged", engine=name, version=version)
            return
        t0 = time.monotonic()
        prepared = await self._prepare_weights(tensors)
        t1 = time.monotonic()
        preempt = self._preempt if self.update_mode == "resume" else None
        async with self._gate.write(on_wait=preempt):
            t2 = time.monotonic()
            count = await self._load_weights(prepared)
            self.version = version
            t3 = time.monotonic()
        self.weights_digest, self.digest_tensors = await self._served_digest(tensors)
        self.last_update = {"prepare_s": t1 - t0, "drain_s": t2 - t1, "load_s": t3 - t2}
        log.info(
            "engine_weights_loaded",
            engine=name,
            version=version,
            tensors=count,
            mode=self.update_mode,
            prepare_s=round(t1 - t0, 4),
            drain_s=round(t2 - t1, 4),
            load_s=round(t3 - t2, 4),
        )

    async def _served_digest(self, tensors: Mapping[str, torch.Tensor] | Path) -> tuple[int, int]:
        """(digest, tensors) of what the last update loaded. Here: the tensors as handed over (an
        engine that can read its parameters back overrides this with what it serves)."""
        if not isinstance(tensors, Mapping):
            return -1, 0
        # A crc32 pass over the update (zlib-ng, GIL released): on a worker, not the event loop.
        return await asyncio.to_thread(
            lambda: (weights_digest(tensor_digest(n, tensor_bytes(t)) for n, t in tensors.items()), len(tensors))
        )

    def _in_flight(self) -> tuple[int, int]:
        """(running, waiting at the gate) among this engine's requests."""
        running = sum(r.running for r in self._requests.values())
        return running, len(self._requests) - running


def safetensors_files(path: Path, where: str) -> list[Path]:
    """The ``*.safetensors`` files of a directory (or the one file given)."""
    path = Path(path)
    if path.is_file() and path.suffix == ".safetensors":
        return [path]
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else []
    if not files:
        raise FileNotFoundError(f"{where}: no *.safetensors file at {path}")
    return files


def tensor_bytes(value: Any) -> memoryview:
    """A tensor's raw bytes (torch, any dtype, bfloat16 included; or bytes-like as fetched)."""
    if hasattr(value, "view") and hasattr(value, "dtype") and not isinstance(value, memoryview):
        import torch

        value = value.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy()
    return memoryview(value).cast("B")
