"""``textarena``: any game of the ``textarena`` package by its id, single-player or against an
opponent in the other seats. Needs the ``textarena`` extra.

    options:  game: str                    a textarena env id ("GuessTheNumber-v0", "TicTacToe-v0",
                                           "Wordle-v0", ...; textarena's ENV_REGISTRY)
              players: int = 0             seats in the game; 0: the fewest the game accepts
                                           (found by resetting it at start-up: 1, 2, ...)
              seat: int = 0                the agent's player id (0 moves first in most games)
              opponent: str = ""           who plays the other seats (required with 2+ players):
                  "random"       agentgym's fixed agent: a uniform pick among the bracketed moves
                                 the game lists in its last "Available/Valid moves" line
                                 (TicTacToe, ConnectFour, Othello, KuhnPoker, ...), seeded by
                                 the task and the turn; "[0]" where the game lists none
                  "hf:PATH"      textarena's own HFLocalAgent on a local Hugging Face checkpoint
                                 (greedy; no network)
                  "module:Class" any textarena Agent (a callable taking the observation text)
                                 built with no arguments: a fixed checkpoint's agent of your own
              observation: str = "new"     "new": each observation holds the game's messages
                                           since the agent's last move; "full": the whole game
                                           so far every turn (what textarena's own LLM agents see)
    task ids: any int seeds a game (``reset(num_players, seed=task_id)``): train, dev and test
              are the procedural envs' disjoint ranges.
    reset ->  the game's prompt and board for the agent's seat (after the opponents' moves if
              they move first).
    step  ->  the agent's move goes to the game (with the game's own action wrappers, e.g.
              "4" becomes "[4]"), then the opponents move until it is the agent's turn again.
              Reward: 0 until the game ends, then the game's reward for the agent's seat (win 1,
              draw 0, loss or repeated invalid moves -1 in two-player games; the game's own
              scale in single-player ones). Success: a final reward of 1 or more. An invalid
              move is the game's business (textarena allows one retry by default).

textarena games have no scripted expert (``expert_action`` raises) and are replayable only with
a deterministic opponent ("random" is; an hf or custom agent should be greedy).
"""

from __future__ import annotations

import random
import re
from typing import Any

from agentgym.envpool.base import Env, StepResult
from agentgym.envpool.envs.ecosystem import one_line, require, unknown

NAME = "textarena"
EXTRA = "textarena"
GAME_ID = -1  # textarena's sender id of the game's own messages
_MOVES_LINE = re.compile(r"(?i)(available|valid|legal)[ _]*(moves|actions)[^\n]*")
_BRACKETED = re.compile(r"\[[^\[\]\n]{1,40}\]")


def random_move(observation: str, rng: random.Random) -> str:
    """A uniform pick among the moves listed in the last moves line of ``observation``."""
    lines = [m.group(0) for m in _MOVES_LINE.finditer(observation)]
    moves = _BRACKETED.findall(lines[-1]) if lines else []
    return rng.choice(moves) if moves else "[0]"


class _RandomAgent:
    """The "random" opponent: deterministic given (task id, its move number)."""

    def __init__(self) -> None:
        self.task_id, self.moves = 0, 0

    def __call__(self, observation: str) -> str:
        self.moves += 1
        return random_move(observation, random.Random(f"{self.task_id}:{self.moves}"))


def _opponent(spec: str) -> Any:
    if spec == "random":
        return _RandomAgent()
    if spec.startswith("hf:"):
        ta = require("textarena", EXTRA, NAME)
        agent = ta.agents.HFLocalAgent(spec[3:], device="cpu", max_new_tokens=32, hf_kwargs={})
        agent.pipeline.generation_config.do_sample = False  # a fixed opponent: same reply, same game
        return agent
    if re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", spec):
        import importlib

        module, _, attr = spec.partition(":")
        cls = getattr(importlib.import_module(module), attr, None)
        if not callable(cls):
            raise ValueError(f"env {NAME}: opponent {spec!r}: {module} has no {attr}")
        return cls()
    raise ValueError(f"env {NAME}: option opponent must be 'random', 'hf:PATH' or 'module:Class', got {spec!r}")


class TextArena(Env):
    name = NAME
    preload = ("textarena",)  # imported once by the pool's zygote, shared by every forked worker

    def __init__(
        self,
        game: str = "",
        players: int = 0,
        seat: int = 0,
        opponent: str = "",
        observation: str = "new",
        **kwargs: object,
    ) -> None:
        super().__init__(**kwargs)
        self._ta = require("textarena", EXTRA, NAME)
        registry = self._ta.envs.registration.ENV_REGISTRY
        if game not in registry:
            raise unknown(NAME, "game", game, registry)
        if observation not in ("new", "full"):
            raise ValueError(f"env {NAME}: option observation must be 'new' or 'full', got {observation!r}")
        if not isinstance(players, int) or isinstance(players, bool) or players < 0:
            raise ValueError(f"env {NAME}: option players must be an integer >= 0, got {players!r}")
        self.game, self.observation = game, observation
        self.players = players or self._players()
        if players:
            self._make()  # a game that cannot be built here fails now, not at the first reset
        if not isinstance(seat, int) or isinstance(seat, bool) or not 0 <= seat < self.players:
            raise ValueError(f"env {NAME}: option seat must be a player id from 0 to {self.players - 1}, got {seat!r}")
        self.seat = seat
        if self.players > 1 and not opponent:
            raise ValueError(
                f"env {NAME}: {game} is a {self.players}-player game: set option opponent "
                "('random', 'hf:PATH' or 'module:Class')"
            )
        # A textarena agent (called on the observation; _others runs it only with players > 1), or None.
        self.opponent: Any = _opponent(opponent) if self.players > 1 else None
        self._env: Any = None
        self._core: Any = None
        self._history: dict[int, list[str]] = {}
        self._done = True
        self._over_at_reset = False

    @classmethod
    def check_options(cls, **options: object) -> None:
        opponent = str(options.get("opponent", ""))
        if opponent.startswith("hf:"):  # loading the checkpoint is the workers' job; it must be there
            from pathlib import Path

            if not (Path(opponent[3:]) / "config.json").is_file():
                raise ValueError(
                    f"env {NAME}: opponent {opponent!r}: no Hugging Face checkpoint (config.json) at {opponent[3:]!r}"
                )
            options = {**options, "opponent": "random"}
        cls(**options)  # type: ignore[arg-type]  # the constructor checks the options it is given

    def _make(self) -> Any:
        try:
            return self._ta.make(self.game)
        except Exception as exc:  # noqa: BLE001 - e.g. NLTK data it cannot download: one line
            raise ValueError(
                f"env {NAME}: game {self.game!r} cannot be made here: {type(exc).__name__}: {one_line(exc)}"
            ) from None

    def _players(self) -> int:
        """The fewest players the game accepts (textarena's games assert their count at reset)."""
        errors: list[str] = []
        for n in range(1, 9):
            game = self._make()
            try:
                game.reset(num_players=n, seed=0)
                return n
            except Exception as exc:  # noqa: BLE001 - a count the game refuses, or a reset that fails
                errors.append(f"{n}: {type(exc).__name__}: {one_line(exc, 120)}")
        raise ValueError(
            f"env {NAME}: {self.game} took no player count from 1 to 8 at reset "
            f"({'; '.join(errors[:2])} ...); set option players"
        )

    def _say(self, pid: int) -> str:
        """The current player's new messages, also kept in its history; own moves left out."""
        _, messages = self._core.get_observation()
        new = self._lines(messages, pid)
        self._history.setdefault(pid, []).extend(new)
        return "\n".join(self._history[pid] if self.observation == "full" or pid != self.seat else new)

    def _lines(self, messages: list[Any], pid: int) -> list[str]:
        roles = self._core.state.role_mapping
        return [
            f"[{'GAME' if sender == GAME_ID else roles.get(sender, f'Player {sender}')}] {text}"
            for sender, text, kind in messages
            if not (sender == pid and kind.name == "PLAYER_ACTION")
        ]

    def _others(self) -> tuple[bool, str]:
        """Opponents move until it is the agent's turn or the game ends: (done, the agent's text)."""
        done = False
        while not done and self._core.state.current_player_id != self.seat:
            pid = self._core.state.current_player_id
            done, _ = self._env.step(self.opponent(self._say(pid)))
        if done:
            return True, self._final()
        return False, self._say(self.seat)

    def _final(self) -> str:
        """The agent's messages since its last move, at the end of the game."""
        pending = self._core.state.observations.get(self.seat, [])
        self._core.state.observations[self.seat] = []
        return "\n".join(self._lines(pending, self.seat))

    def reset(self, task_id: int) -> str:
        # A new game object every episode: textarena's wrappers keep history across resets.
        self._env = self._ta.make(self.game)
        core = self._env
        while isinstance(core, self._ta.Wrapper):
            core = core.env
        self._core, self._history, self._done = core, {}, False
        if isinstance(self.opponent, _RandomAgent):
            self.opponent.task_id, self.opponent.moves = task_id, 0
        self._env.reset(num_players=self.players, seed=task_id)
        # An opponent can end the game before the agent's first move (two invalid moves lose it):
        # then the agent's first step only collects the result.
        self._over_at_reset, text = self._others()
        return text or "the game is over"

    def step(self, action: str) -> StepResult:
        if self._done or self._env is None:
            return StepResult("the game is over", 0.0, True, {"success": False})
        if self._over_at_reset:
            done, text = True, ""
        else:
            done, _ = self._env.step(action)
            done, text = self._others() if not done else (True, self._final())
        if not done:
            return StepResult(text, 0.0, False, {})
        self._done = True
        rewards, game_info = self._env.close()
        reward = float((rewards or {}).get(self.seat, 0.0))
        reason = (game_info or {}).get(self.seat, {}).get("reason", "")
        info: dict[str, str | int | float | bool] = {"success": reward >= 1.0}
        if reason:
            info["reason"] = one_line(reason, 200)
        text = "\n".join(t for t in (text, f"[GAME] {reason}" if reason and reason not in text else "") if t)
        return StepResult(text or "the game is over", reward, True, info)

    def expert_action(self) -> str:
        raise NotImplementedError(f"env {NAME}: textarena games have no scripted expert")

    def close(self) -> None:
        self._env = self._core = None
