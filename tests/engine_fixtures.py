"""Engines for tests that compare an episode's tokens with what the engine produced."""

from __future__ import annotations

from agentgym.actors.engines.engine import Generation, SamplingSpec
from agentgym.actors.engines.hf_engine import HfEngine


class RecordingEngine(HfEngine):
    """The reference engine, keeping every prompt it was given and generation it returned."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[tuple[list[int], Generation]] = []

    async def generate(self, request_id: str, prompt_ids: list[int], spec: SamplingSpec) -> Generation:
        gen = await super().generate(request_id, prompt_ids, spec)
        self.seen.append((list(prompt_ids), gen))
        return gen
