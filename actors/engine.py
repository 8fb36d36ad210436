"""The inference engine interface: tokens in, tokens + behaviour logprobs out, versioned weights.

    engine: InferenceEngine = VllmEngine(model_dir, seed=0)      # actors/vllm_engine.py
    await engine.start()
    gen = await engine.generate("group/0/turn/0", prompt_ids, SamplingSpec(max_tokens=32))
    gen.token_ids, gen.logprobs, gen.version, gen.finish_reason
    await engine.update_weights({"model.embed_tokens.weight": t, ...}, version=1)
    await engine.close()

Everything the rollout code needs from an engine is here, so a second engine (another server,
a plain ``transformers`` loop) plugs in by implementing ``InferenceEngine``.

Contract:
- ``Generation.logprobs[i]`` is the log-probability of ``token_ids[i]`` under the distribution
  the engine actually sampled from: ``log_softmax(logits / temperature)`` (renormalized over
  the nucleus when ``top_p < 1``). That is what the learner recomputes for importance weights.
- Versions: a request never straddles two weight versions. ``update_weights`` waits for the
  requests in flight to finish while new requests wait for the update (``VersionGate``), so
  every token of a ``Generation`` was sampled with the weights of ``Generation.version``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

FinishReason = Literal["stop", "length", "abort"]


@dataclass(frozen=True)
class SamplingSpec:
    """How to sample one agent turn."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"SamplingSpec.max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"SamplingSpec.temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingSpec.top_p must be in (0, 1], got {self.top_p}")


@dataclass(frozen=True)
class Generation:
    """One sampled turn: the tokens, their behaviour logprobs and the weight version."""

    token_ids: list[int]
    logprobs: list[float]
    version: int
    finish_reason: FinishReason

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(
                f"Generation: {len(self.token_ids)} token ids but {len(self.logprobs)} logprobs"
            )


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
        learner's version 0 before it plays)."""

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
    async def write(self) -> AsyncIterator[None]:
        self.writers_waiting += 1
        try:
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
