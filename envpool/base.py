"""The environment interface: what an env implements to be played by agentgym actors.

An ``Env`` runs inside an env worker subprocess (``agentgym.envpool.worker``) and is plain,
synchronous Python; the actor sees it through the asyncio ``EnvPool``. A minimal env:

    class Coin(Env):
        name = "coin"

        def __init__(self, sides: int = 2, **kwargs):
            super().__init__(**kwargs)   # rejects unknown options with a clear error
            self.sides = sides

        def reset(self, task_id: int) -> str: ...
        def step(self, action: str) -> StepResult: ...
        def expert_action(self) -> str: ...

and ``register_env("coin", "my_pkg.coin:Coin")`` (``agentgym.envpool.registry``).

Contract:
- ``reset(task_id)`` starts an episode; the first observation and everything after it is a
  deterministic function of ``task_id`` and the actions taken.
- ``step(action)`` never raises for a bad action: it answers with feedback text as the
  observation, reward 0, and the turn counts. An exception inside ``step`` is a bug in the env:
  the pool fails that one episode (``EnvFailure(reason="env_error")``).
- ``instructions()`` is the task text an agent sees before the first observation (a system or
  first user message); an env may return "" and put everything in the first observation.
- ``expert_action()`` is a scripted expert that may use privileged state; it proves that tasks
  are solvable and gives demonstrations.
- ``tasks(split)`` (a classmethod) lists the task ids of a split ("train", "test", and "dev"
  where the env has one). Procedural envs keep the default: disjoint integer ranges, so a test
  task is never trained on. Envs with a fixed task set (a dataset, a package's variations)
  override it.
"""

from __future__ import annotations

import abc
import inspect
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

InfoValue = str | int | float | bool

SPLITS = ("train", "dev", "test")
# Default task-id ranges for procedural envs (any int seeds an episode): disjoint by split.
_PROCEDURAL = {
    "train": range(0, 1 << 30),
    "dev": range(1 << 30, (1 << 30) + 10_000),
    "test": range((1 << 30) + 10_000, (1 << 30) + 20_000),
}


def split_of(task_id: int) -> str | None:
    """The split whose default (procedural) range holds ``task_id``; None if none does."""
    return next((split for split, ids in _PROCEDURAL.items() if task_id in ids), None)


def int_in(value: object, lo: int, hi: int) -> bool:
    """Whether an option's value is an integer (not a bool) from ``lo`` to ``hi``."""
    return isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi


def curriculum_option(env: str, key: str, values: object, lo: int, hi: int) -> list[int] | None:
    """A curriculum option of a procedural env (maze's ``train_sizes``, TextCraft's
    ``train_distractors``): None, or a non-empty list of integers from ``lo`` to ``hi``; anything
    else is a ValueError naming the env and the option."""
    if values is None:
        return None
    if not (isinstance(values, list | tuple) and values and all(int_in(v, lo, hi) for v in values)):
        raise ValueError(f"{env}: option {key} must be a non-empty list of integers from {lo} to {hi}, got {values!r}")
    return list(values)


def for_task(curriculum: list[int] | None, task_id: int, default: int) -> int:
    """A curriculum option's value for ``task_id``: a training task takes
    ``curriculum[task_id % len(curriculum)]``, a dev or test task (or any, without one) ``default``,
    so training mixes in easier tasks while the held-out ones keep theirs."""
    if curriculum is not None and split_of(task_id) == "train":
        return curriculum[task_id % len(curriculum)]
    return default


def option_names(cls: type) -> set[str] | None:
    """The option names an env class takes by the contract of ``Env.__init__``: the keyword
    parameters of each ``__init__`` up its class chain, as long as each passes the rest on with
    ``**kwargs``; None when one takes positional-only or ``*args`` parameters (nothing to judge by)."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if klass is Env or klass is object:
            break
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        params = list(inspect.signature(init).parameters.values())[1:]  # not self
        if any(p.kind in (p.POSITIONAL_ONLY, p.VAR_POSITIONAL) for p in params):
            return None
        names |= {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break  # the rest is refused here
    return names


@dataclass(frozen=True)
class StepResult:
    """What one step returns. ``info`` is small and msgpack-able; ``success`` marks a solved task."""

    observation: str
    reward: float
    done: bool
    info: dict[str, InfoValue] = field(default_factory=dict)


class Env(abc.ABC):
    """One environment instance; reused across episodes (each starts with ``reset``)."""

    name: ClassVar[str]
    replayable: ClassVar[bool] = True
    """Whether replaying an episode's actions on a new instance after ``reset(task_id)`` rebuilds
    its state (the contract above). An actor that leaves hands its episodes of a replayable env
    over to another actor, which replays them and plays on; an env whose state lives elsewhere
    (a remote server, a live site) sets False and its episodes are played again from the start."""

    agent_program: ClassVar[str | None] = None
    """The agent program (``"module:function"``) that plays this env's episodes through the actor's
    agent endpoint (docs/agents.md) instead of env workers; a run of such an env must enable the
    endpoint with this program, which the start-up check says in one line (the verifiers
    adapter). None: played in env workers."""

    preload: ClassVar[tuple[str, ...]] = ()
    """Modules the pool's zygote imports before it forks the workers (envpool/zygote.py): a
    package the env module imports only inside functions, so that the workers share one import
    instead of each paying it at start. One that is not installed is skipped there (the env's
    construction in the worker reports it)."""

    def __init__(self, **kwargs: object) -> None:
        # Subclasses take their options as keyword arguments and pass the rest here, so a typo in
        # a config's env.kwargs is an error naming the option instead of being silently ignored.
        if kwargs:
            raise TypeError(f"env {getattr(self, 'name', type(self).__name__)}: unknown option(s) {sorted(kwargs)}")

    @abc.abstractmethod
    def reset(self, task_id: int) -> str:
        """Start the episode for ``task_id``; returns the first observation."""

    @abc.abstractmethod
    def step(self, action: str) -> StepResult:
        """Apply the agent's action text; an invalid action gets feedback, never an exception."""

    @abc.abstractmethod
    def expert_action(self) -> str:
        """The scripted expert's next action in the current episode."""

    @classmethod
    def tasks(cls, split: str = "train", **options: object) -> Sequence[int]:
        """Task ids of ``split`` (``options`` are the env's kwargs, for envs whose task set
        depends on them). The default suits procedural envs: large disjoint ranges."""
        if split not in SPLITS:
            raise ValueError(f"env {cls.__name__}: unknown split {split!r}; splits are {list(SPLITS)}")
        return _PROCEDURAL[split]

    @classmethod
    def check_options(cls, **options: object) -> None:
        """Check ``options`` (a config's env.kwargs) in the process that launches a run, before any
        worker starts: raise a ValueError, TypeError or ImportError of one line naming what is
        wrong. Called through ``registry.check_env``, the one start-up check of a config's env,
        which names the config key (``agentgym train`` prints it and stops). The default checks
        the option names against the keyword parameters of the class's ``__init__`` chain (the
        contract above: unknown ones reach ``Env.__init__``), without constructing the env, so
        naming an env still costs no start of a JVM or a browser; the workers' construction
        checks the values. Envs whose options are not keyword parameters, or whose tasks come
        from a package (a dataset, a game by id), override it (the adapters construct the env)."""
        names = option_names(cls)
        unknown = sorted(set(options) - names) if names is not None else []
        if unknown:
            name = getattr(cls, "name", cls.__name__)
            raise TypeError(f"env {name}: unknown option(s) {unknown}; its options are {sorted(names or ()) or 'none'}")

    def random_action(self, rng: random.Random) -> str:
        """A uniformly random action for the current episode (no better than chance, no privileged
        state), used to write the random-play transcripts a demo base model is pretrained on
        (``agentgym.models.base``). Optional: the default says the env has none."""
        raise NotImplementedError(f"env {type(self).__name__} does not define random_action()")

    def quiz(self) -> tuple[str, str] | None:
        """After a lost episode: the env's last reply asked as a question about what was hidden, and
        the answer (Wordle: "... No guesses left. What was the word?", the word). None where the
        env has none (the default), before the episode is over, and after one that was won. Used
        only to write a demo base model's transcripts (``model.pretrain_quiz``): the answer is a
        fact about the finished game, never a move in it."""
        return None

    def instructions(self) -> str:
        """Task text shown before the first observation ("" when the observation says it all)."""
        return ""

    def close(self) -> None:
        """Release resources (files, child processes); called once when the worker exits."""
