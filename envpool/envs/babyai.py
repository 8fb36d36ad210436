"""``babyai``: the BabyAI levels of PyPI ``minigrid``, played in text.

The agent reads what it sees in its 7x7 egocentric view (objects with colours and positions
relative to it, the nearest walls ahead and to each side), what it carries, and the mission; it
answers with one of six primitive actions, the BabyAI action set minus ``done``:

    turn left | turn right | go forward | pick up | drop | toggle

(case, surrounding spaces and a final period are ignored; ``left``, ``right``, ``forward``,
``move forward``, ``pickup`` and ``open`` are accepted as aliases). Anything else is answered
with the list of actions and counts as a turn.

    options:  levels: str | list[str] | None = None   level names, "GoToLocal" or "BabyAI-GoToLocal-v0",
                                  as a list or comma-separated ("GoToLocal,PickupLoc", for config
                                  files); None = PAPER_LEVELS (the 19 levels of the BabyAI paper)
              read_actions: str = "exact"   "exact": the reply is the action; "first": the first
                                  action (or alias) named in the reply counts, for a model that
                                  answers in a sentence (envpool/actions.py)
              progress_reward: bool = False   also reward each action by the progress it makes:
                                  (d_before - d_after) / d_start, d the fewest actions the
                                  mission still needs (envpool/envs/babyai_progress.py: turns and
                                  steps to face the object, + 1 to pick it up); GoTo and Pickup
                                  missions only (others are refused at reset). Success is still
                                  the mission's alone.
    task id:  level = levels[task_id % len(levels)], seed = task_id  (minigrid's reset(seed=...))
    reward:   BabyAI's: 1 - 0.9 * turns / max_steps on success (turns include invalid actions),
              else 0, plus the progress above if asked; done on success and after the level's
              max_steps turns (truncated, "out of time"); only minigrid's strict ``...Debug``
              levels can also end on a failed mission
    expert:   minigrid's BabyAIBot, kept in step with the actions actually taken

The multi-room levels (GoTo, BossLevel, ...) need hundreds of primitive actions; for short
turn limits pick single-room levels (``levels=["GoToLocal", "PickupLoc", "PutNextLocal"]``).
minigrid is imported when the env is built, so naming the env or listing its tasks stays light.
"""

from __future__ import annotations

import contextlib
import io
import random
from typing import Any

from agentgym.envpool.actions import check_read, first_action
from agentgym.envpool.base import Env, StepResult
from agentgym.envpool.envs import babyai_progress

PAPER_LEVELS = (
    "GoToObj",
    "GoToRedBallGrey",
    "GoToRedBall",
    "GoToLocal",
    "PutNextLocal",
    "PickupLoc",
    "GoToObjMaze",
    "GoTo",
    "Pickup",
    "UnblockPickup",
    "Open",
    "Unlock",
    "PutNextS7N4",
    "Synth",
    "SynthLoc",
    "GoToSeq",
    "SynthSeq",
    "GoToImpUnlock",
    "BossLevel",
)
"""Default levels: Chevalier-Boisvert et al. 2019, Table 1 (PutNext is minigrid's PutNextS7N4)."""

ACTIONS = ("turn left", "turn right", "go forward", "pick up", "drop", "toggle")
"""Action words, in minigrid's action order (left, right, forward, pickup, drop, toggle)."""

_ALIASES = {"left": 0, "right": 1, "forward": 2, "move forward": 2, "pickup": 3, "open": 5}
_PARSE = {**{a: i for i, a in enumerate(ACTIONS)}, **_ALIASES}
_VIEW = 7  # minigrid's default agent_view_size: the agent stands at (3, 6) of its view, facing row 0


def level_id(name: str) -> str:
    """``"GoToLocal"`` -> ``"BabyAI-GoToLocal-v0"``; a full gymnasium id is kept."""
    return name if name.startswith("BabyAI-") else f"BabyAI-{name}-v0"


def _steps(n: int) -> str:
    return f"{n} step" if n == 1 else f"{n} steps"


def _where(ahead: int, side: int) -> str:
    if ahead == 1 and side == 0:
        return "right in front of you"
    parts = [f"{_steps(ahead)} ahead"] if ahead else []
    if side:
        parts.append(f"{_steps(abs(side))} to the {'left' if side < 0 else 'right'}")
    return " and ".join(parts)


def _name(obj: Any) -> str:
    if obj.type == "door":
        state = "locked" if obj.is_locked else "open" if obj.is_open else "closed"
        return f"{state} {obj.color} door"
    return f"{obj.color} {obj.type}"


def describe_view(env: Any) -> str:
    """What the agent sees and carries, from minigrid's partial view (occlusion included)."""
    grid, visible = env.gen_obs_grid()
    me = _VIEW // 2
    seen, walls = [], []
    for j in range(_VIEW):
        for i in range(_VIEW):
            if (i, j) == (me, _VIEW - 1) or not visible[i, j]:
                continue
            obj = grid.get(i, j)
            if obj is not None and obj.type not in ("wall", "empty"):
                seen.append((_VIEW - 1 - j + abs(i - me), _VIEW - 1 - j, i - me, _name(obj)))
    for label, cells in (
        ("ahead", [(me, j) for j in range(_VIEW - 2, -1, -1)]),
        ("to the left", [(i, _VIEW - 1) for i in range(me - 1, -1, -1)]),
        ("to the right", [(i, _VIEW - 1) for i in range(me + 1, _VIEW)]),
    ):
        for n, (i, j) in enumerate(cells, start=1):
            obj = grid.get(i, j) if visible[i, j] else None
            if obj is not None and obj.type == "wall":
                walls.append(f"{_steps(n)} {label}")
                break
            if obj is not None and not (obj.type == "door" and obj.is_open):
                break  # something else blocks the line; it is listed with the objects
    seen.sort()  # nearest first
    lines = []
    if seen:
        lines.append("You see " + ", ".join(f"a {name} {_where(a, s)}" for _, a, s, name in seen) + ".")
    else:
        lines.append("You see no objects.")
    if walls:
        lines.append("Walls: " + ", ".join(walls) + ".")
    carrying = env.carrying
    lines.append(f"You are carrying a {_name(carrying)}." if carrying is not None else "You are carrying nothing.")
    return "\n".join(lines)


class BabyAI(Env):
    name = "babyai"

    def __init__(
        self,
        levels: str | list[str] | tuple[str, ...] | None = None,
        progress_reward: bool = False,
        read_actions: str = "exact",
        **kwargs: object,
    ) -> None:
        super().__init__(**kwargs)
        self.read_actions = check_read("babyai", read_actions)
        if not isinstance(progress_reward, bool):
            raise TypeError(f"babyai: option progress_reward must be true or false, got {progress_reward!r}")
        self.progress_reward = progress_reward
        self._to_go: int | None = None  # with progress_reward: the actions the mission needs now
        self._start_to_go = 1
        import gymnasium
        import minigrid  # noqa: F401  (registers the BabyAI levels with gymnasium)
        from minigrid.utils.baby_ai_bot import BabyAIBot

        if levels is None:
            levels = PAPER_LEVELS
        if isinstance(levels, str):  # config kwargs are scalars: "GoToLocal,PickupLoc"
            levels = [name.strip() for name in levels.split(",") if name.strip()]
        if not isinstance(levels, (list, tuple)) or not levels:
            raise TypeError(f"babyai: option levels must be level names (a list or 'A,B,C'), got {levels!r}")
        known = {k for k in gymnasium.registry if k.startswith("BabyAI-")}
        for name in levels:
            if not isinstance(name, str) or level_id(name) not in known:
                short = sorted(k[len("BabyAI-") :].rsplit("-", 1)[0] for k in known)
                raise ValueError(f"babyai: option levels: unknown level {name!r}; known levels: {', '.join(short)}")
        self.levels = [level_id(n) for n in levels]
        self._make = gymnasium.make
        self._bot_cls = BabyAIBot
        self._envs: dict[str, Any] = {}  # one minigrid env per level, reused across episodes
        self._env: Any = None
        self._turns = 0
        self._done = True
        # The expert: minigrid's bot must plan once per env step, told the action actually taken
        # (None when it was the bot's own suggestion). It is built on the first expert_action of
        # an episode and from then on follows every step, asked or not.
        self._bot: Any = None
        self._taken: int | None = None  # the action of the last step, for the bot's next plan
        self._suggestion: int | None = None  # the bot's plan for the current state, if made

    def _level_env(self, level: str) -> Any:
        env = self._envs.get(level)
        if env is None:
            # .unwrapped: skip gymnasium's checker wrappers, which only re-validate every step.
            env = self._envs[level] = self._make(level).unwrapped
        return env

    def reset(self, task_id: int) -> str:
        level = self.levels[task_id % len(self.levels)]
        self._env = self._level_env(level)
        # BabyAI's rejection sampling prints "Sampling rejected: ..." for every retry: not news.
        with contextlib.redirect_stdout(io.StringIO()):
            self._env.reset(seed=task_id)
        self._turns = 0
        self._done = False
        self._bot = None
        self._taken = self._suggestion = None
        if self.progress_reward:
            if not babyai_progress.supported(self._env):
                raise ValueError(
                    f"babyai: option progress_reward needs GoTo or Pickup missions; level {level} "
                    f"(task {task_id}) has {self._env.mission!r}"
                )
            self._to_go = babyai_progress.actions_to_go(self._env)
            self._start_to_go = max(1, self._to_go or 1)
        return f"Your mission: {self._env.mission}.\n{describe_view(self._env)}"

    def _progress(self) -> float:
        """This step's share of the way (progress_reward), from the distance before it."""
        if not self.progress_reward:
            return 0.0
        before, self._to_go = self._to_go, babyai_progress.actions_to_go(self._env)
        if before is None or self._to_go is None:
            return 0.0
        return (before - self._to_go) / self._start_to_go

    def instructions(self) -> str:
        mission = f" Your mission: {self._env.mission}." if self._env is not None else ""
        return (
            "You are an agent in a grid world of rooms, walls, doors and objects (balls, boxes, keys)."
            f"{mission} Each turn you see what is in front of you and around you, then answer with "
            "exactly one action: turn left, turn right, go forward, pick up, drop, toggle "
            "(toggle opens a door in front of you; a locked door needs the key of its colour)."
        )

    def step(self, action: str) -> StepResult:
        env = self._env
        if env is None or self._done:
            return StepResult("The episode is over.", 0.0, True, {"turns": self._turns, "success": False})
        self._turns += 1
        a = _PARSE.get(" ".join(action.lower().strip().rstrip(".!").split()))
        if a is None and self.read_actions == "first":
            a = first_action(action, _PARSE)
        if a is None:
            feedback = f"Invalid action {action[:60]!r}. Choose one of: {', '.join(ACTIONS)}."
            return self._finish(feedback, 0.0, terminated=False, valid=False)
        if self._bot is not None:
            self._follow(a)
        before = (tuple(env.agent_pos), env.carrying, self._front_state())
        _, reward, terminated, _, _ = env.step(a)
        feedback = self._feedback(a, before)
        if terminated and reward > 0:
            # The mission's last action: its progress is the rest of the way (d_after 0).
            progress = self._to_go / self._start_to_go if self.progress_reward and self._to_go is not None else 0.0
            reward = 1.0 - 0.9 * self._turns / env.max_steps
            return self._finish(f"{feedback} Mission complete!", reward + progress, terminated=True, success=True)
        if terminated:
            return self._finish(f"{feedback} Mission failed.", 0.0, terminated=True)
        return self._finish(f"{feedback}\n{describe_view(env)}", self._progress(), terminated=False)

    def _finish(
        self, text: str, reward: float, *, terminated: bool, success: bool = False, valid: bool = True
    ) -> StepResult:
        info: dict[str, str | int | float | bool] = {"turns": self._turns}
        if not valid:
            info["valid"] = False
        if not terminated and self._turns >= self._env.max_steps:
            text, terminated = f"{text}\nOut of time.", True
        if terminated:
            self._done = True
            info["success"] = success
        return StepResult(text, reward, terminated, info)

    def _front_state(self) -> str | None:
        front = self._env.grid.get(*self._env.front_pos)
        return None if front is None else _name(front)

    def _feedback(self, a: int, before: tuple[Any, Any, str | None]) -> str:
        env = self._env
        pos, carrying, front = before
        if a in (0, 1):
            return f"You turned {'left' if a == 0 else 'right'}."
        if a == 2:
            return (
                "You moved forward."
                if tuple(env.agent_pos) != pos
                else f"You cannot move: {front or 'something'} ahead."
            )
        if a == 3:
            if env.carrying is not None and carrying is None:
                return f"You picked up the {_name(env.carrying)}."
            return "You are already carrying something." if carrying is not None else "There is nothing to pick up."
        if a == 4:
            if carrying is not None and env.carrying is None:
                return f"You dropped the {_name(carrying)}."
            return "You cannot drop here." if carrying is not None else "You are carrying nothing."
        after = self._front_state()
        if front is None or front == after:
            return f"Nothing happens: the {front} stays as it is." if front else "There is nothing to toggle."
        if front.endswith("door"):
            assert after is not None  # a door in front is still in front once toggled
            return f"The {front} is now {after.split(' ', 1)[0]}."
        return f"You opened the {front}."

    def _follow(self, a: int) -> None:
        """Tell the bot that action ``a`` is taken now (before the env steps)."""
        try:
            if self._suggestion is None:  # not asked in this state: plan it now, to stay in step
                self._suggestion = self._bot.replan(self._taken)
        except Exception:  # noqa: BLE001
            # The bot gives up on some agent moves (it raises DisappearedBoxError when a box is
            # opened, asserts on states it did not plan for); the agent's step must not fail for
            # it: the next expert_action builds a fresh bot from the state it finds.
            self._bot = None
            return
        self._taken = None if a == self._suggestion else a
        self._suggestion = None

    def random_action(self, rng: random.Random) -> str:
        return rng.choice(ACTIONS)

    def expert_action(self) -> str:
        if self._env is None or self._done:
            return ACTIONS[0]
        if self._suggestion is None and self._bot is not None:
            try:
                self._suggestion = self._bot.replan(self._taken)
            except Exception:  # noqa: BLE001 - the bot gave up on the agent's moves (see _follow)
                self._bot = None
        if self._bot is None:
            # A fresh bot plans from the state as it is; on the rare state it cannot plan for (a
            # box the mission needs was opened), the expert turns in place: the mission is lost.
            bot = self._bot_cls(self._env)
            try:
                self._suggestion = bot.replan()
            except Exception:  # noqa: BLE001
                self._suggestion = None
                return ACTIONS[0]
            self._bot = bot
        # The bot answers `done` only once it thinks the mission is complete, which ends the
        # episode first; turning is the harmless stand-in should it ever come up.
        assert self._suggestion is not None
        return ACTIONS[self._suggestion] if self._suggestion < len(ACTIONS) else ACTIONS[0]
