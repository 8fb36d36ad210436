"""An OpenEnv environment (pip ``openenv-core`` 0.3.0) with nothing of agentgym in it: find a
hidden number from 1 to ``high`` by "higher" / "lower" hints, in at most ``max_guesses`` guesses;
a right guess pays 1.

    [env]
    name = "openenv"
    kwargs = { env = "openenv_guess:GuessEnvironment", high = 8, python_path = ["examples"] }

The same class runs under OpenEnv's own server, as any OpenEnv environment does:
``openenv.core.env_server.create_app(GuessEnvironment, GuessAction, GuessObservation)`` is its
FastAPI app (``uvicorn``), and OpenEnv's HTTP clients play it over the network.
"""

from __future__ import annotations

import random
from typing import Any
from uuid import uuid4

from openenv.core.env_server import Action, Environment, Observation, State
from pydantic import Field


class GuessAction(Action):
    guess: int = Field(..., description="the number guessed")


class GuessObservation(Observation):
    message: str = Field(default="", description="the hint")


class GuessEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, high: int = 8, max_guesses: int = 6) -> None:
        super().__init__()
        if high < 2:
            raise ValueError(f"high must be at least 2, got {high}")
        self.high, self.max_guesses = high, max_guesses
        self._state = State(episode_id=str(uuid4()), step_count=0)
        self._secret = 1

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> GuessObservation:
        self._secret = random.Random(seed).randint(1, self.high)
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        return GuessObservation(message=f"I am thinking of a number from 1 to {self.high}. Guess it.")

    def step(self, action: GuessAction, timeout_s: float | None = None, **kwargs: Any) -> GuessObservation:  # type: ignore[override]  # OpenEnv types step with its base Action
        self._state.step_count += 1
        if action.guess == self._secret:
            return GuessObservation(message="Correct!", done=True, reward=1.0)
        hint = "higher" if action.guess < self._secret else "lower"
        done = self._state.step_count >= self.max_guesses
        return GuessObservation(message=f"{hint}" + (" (no guesses left)" if done else ""), done=done, reward=0.0)

    @property
    def state(self) -> State:
        return self._state
