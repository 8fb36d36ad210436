"""A simulated inference engine: no model, tokens at a configured rate, real weight bookkeeping.

    engine = SimEngine(vocab_size=1000, tokens_per_s=200, latency_s=0.05, seed=0)   # actor.engine = "sim"
    await engine.start()
    gen = await engine.generate("g/0", prompt_ids, SamplingSpec(max_tokens=32))
    await engine.update_weights({"w": tensor_or_bytes}, version=3)
    engine.digests["w"]            # crc32 of the bytes that version loaded

What it is for: many actors on few cores (scale-out and control-plane benchmarks, the weight
fan-out tests), where a real engine would spend the machine on matrix products. Everything
around the model is the real thing: it is a ``GatedEngine``, so weight updates pause and resume
requests exactly as the other engines do (``update_mode`` resume or drain), every token carries
the version that "sampled" it, aborts end requests, and a weight update keeps the crc32 of each
tensor it loaded, so a test can check which bytes an actor serves.

Sampling: after ``latency_s`` (time to first token) a request produces tokens at
``tokens_per_s`` each, ids uniform in ``[0, vocab_size)``, each with a log-probability drawn
like a sampled token's (log of a uniform in (0.02, 1], so -3.9 <= logprob <= 0). With
``stop_token_ids`` each token is a stop token with probability ``stop_p``, so turns end
"stop" or "length" in a mix. Seeded requests repeat: the same seed, prompt length and position
give the same token.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Mapping
from typing import Any

from agentgym.actors.engines.engine import EngineLoad, FinishReason, GatedEngine, Generation, SamplingSpec, UpdateMode
from agentgym.protocol.weights import crc32

TICK_S = 0.02
"""Least time between a request's wake-ups: tokens due meanwhile come out together."""


def tensor_crc32(value: Any) -> int:
    """crc32 of a tensor's raw bytes: a torch tensor (any dtype, bfloat16 included), or a
    bytes-like object as the weight fetcher returns it."""
    if hasattr(value, "view") and hasattr(value, "dtype") and not isinstance(value, memoryview):
        import torch

        value = value.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy()
    return crc32(memoryview(value).cast("B"))


class SimEngine(GatedEngine):
    """See the module docstring. ``partial_updates``: it loads any subset of tensors."""

    partial_updates = True

    def __init__(
        self,
        *,
        vocab_size: int = 1000,
        tokens_per_s: float = 200.0,
        latency_s: float = 0.05,
        stop_p: float = 0.02,
        seed: int = 0,
        update_mode: UpdateMode = "resume",
    ) -> None:
        super().__init__(update_mode)
        if vocab_size < 1:
            raise ValueError(f"SimEngine: vocab_size must be >= 1, got {vocab_size}")
        if tokens_per_s <= 0:
            raise ValueError(f"SimEngine: tokens_per_s must be > 0, got {tokens_per_s}")
        if latency_s < 0:
            raise ValueError(f"SimEngine: latency_s must be >= 0, got {latency_s}")
        if not 0 <= stop_p <= 1:
            raise ValueError(f"SimEngine: stop_p must be in [0, 1], got {stop_p}")
        self.vocab_size, self.tokens_per_s, self.latency_s, self.stop_p = vocab_size, tokens_per_s, latency_s, stop_p
        self._rng = random.Random(seed)
        self._stop: dict[str, asyncio.Event] = {}
        self.digests: dict[str, int] = {}
        """crc32 of every tensor loaded so far (the newest bytes per name)."""
        self.tokens_generated = 0
        self.started = False

    async def start(self) -> None:
        self.started = True

    async def close(self) -> None:
        for ev in self._stop.values():
            ev.set()
        self.started = False

    def load(self) -> EngineLoad:
        running, waiting = self._in_flight()
        return EngineLoad(running=running, waiting=waiting, kv_cache_usage=0.0)

    def _draw(self, base: int | None, position: int) -> random.Random:
        """The generator of one token: from the engine's stream when unseeded; seeded requests
        draw from (seed - prompt length, absolute position), which a resumed segment (seed
        shifted and prompt longer by the tokens so far) keeps, so it samples what it would have."""
        if base is None:
            return self._rng
        return random.Random(base * 1_000_003 + position)

    async def _generate(self, segment_id: str, prompt_ids: list[int], spec: SamplingSpec) -> Generation:
        if not self.started:
            raise RuntimeError("SimEngine.generate before start()")
        stop = self._stop[segment_id] = asyncio.Event()
        base = None if spec.seed is None else spec.seed - len(prompt_ids)
        ids: list[int] = []
        logprobs: list[float] = []
        finish: FinishReason = "length"
        try:
            if await self._wait(stop, self.latency_s):
                return Generation(ids, logprobs, self.version, "abort")
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            while True:
                # Every token due by now at tokens_per_s, then one wait: at most TICK_S apart, so
                # hundreds of requests cost tens of wake-ups a second each, not one per token.
                due = min(spec.max_tokens, int((loop.time() - t0) * self.tokens_per_s))
                while len(ids) < due and finish == "length":
                    rng = self._draw(base, len(prompt_ids) + len(ids))
                    stops = bool(spec.stop_token_ids) and rng.random() < self.stop_p
                    tok = spec.stop_token_ids[0] if stops else rng.randrange(self.vocab_size)
                    while tok in spec.banned_token_ids:  # never sampled (protocol/vocab.py)
                        tok = rng.randrange(self.vocab_size)
                    ids.append(tok)
                    logprobs.append(math.log(0.02 + 0.98 * rng.random()))
                    if stops:
                        finish = "stop"
                if finish == "stop" or len(ids) >= spec.max_tokens:
                    break
                next_at = t0 + (len(ids) + 1) / self.tokens_per_s
                if await self._wait(stop, max(next_at - loop.time(), TICK_S)):
                    finish = "abort"
                    break
        finally:
            self._stop.pop(segment_id, None)
            self.tokens_generated += len(ids)
        return Generation(ids, logprobs, self.version, finish)

    @staticmethod
    async def _wait(stop: asyncio.Event, seconds: float) -> bool:
        """Sleep ``seconds`` unless aborted first; True if aborted."""
        if stop.is_set():
            return True
        if seconds <= 0:
            await asyncio.sleep(0)
            return stop.is_set()
        try:
            await asyncio.wait_for(stop.wait(), seconds)
            return True
        except TimeoutError:
            return False

    async def _abort(self, segment_id: str) -> None:
        ev = self._stop.get(segment_id)
        if ev is not None:
            ev.set()

    async def _load_weights(self, prepared: object) -> int:
        if not isinstance(prepared, Mapping):
            raise TypeError(f"SimEngine loads named tensors, not {type(prepared).__name__} (no model files to read)")
        for name, value in prepared.items():
            self.digests[name] = tensor_crc32(value)
        return len(prepared)
