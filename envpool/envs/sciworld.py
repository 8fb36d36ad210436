"""``sciworld``: ScienceWorld's 30 science tasks (PyPI ``scienceworld``, a JVM simulator).

The simulator is Scala in a jar inside the package; each env instance starts its own JVM
(Java 17+, ~1 s start, ~300 MB resident with the default ``-Xmx384m -XX:+UseSerialGC``) and
talks to it over py4j. The jar is launched by py4j with the JVM options of the
``JAVA_TOOL_OPTIONS`` environment variable, which this env sets for its own process (an env
worker hosts one env) before the launch, so the heap is bounded per environment.

    options:  task_names: str = ""        comma-separated task names ("boil,melt"), "" = all 30
              simplifications: str = ""   ScienceWorld's, e.g. "easy" or "teleportAction,openDoors"
              jvm_heap_mb: int = 384      the JVM's -Xmx
              jvm_options: str = "-XX:+UseSerialGC"
    task ids: every (task, variation) of the selected tasks, numbered train first, then dev, then
              test, each in the package's task order (``scienceworld.constants.TASKS``) and by
              variation; the variations of each split are the package's own
              (``get_variations_train/dev/test``: the first ~half train, a quarter dev, the rest
              test). So ``tasks("train")`` is ``range(0, N_train)``: a config's
              ``task_start = 0, task_count = N_train`` trains on exactly the train split.
    reset ->  the room the agent is in (ScienceWorld's "look around"); ``instructions()`` has the
              task description and the action forms.
    actions:  ScienceWorld's text commands ("open door to kitchen", "focus on thermometer", ...);
              from a longer reply the text after the last "Action:" is taken, first line only.
              An unknown command gets the simulator's "No known action matches that input." and
              counts as a turn; an ambiguous one gets its numbered choices (answer with the number).
    reward:   the change of the task score, normalised to [0, 1], so an episode's rewards add up
              to its final score. Done when the task is completed or failed (ScienceWorld scores
              a failed task -100: that counts as score 0). Success: completed with score 100.
    expert:   the package's gold action sequence for the variation; it is followed step by step
              while the agent takes the same actions (a different action keeps the suggestion).
              Generating it costs about a second, so reset does not: the first expert_action of an
              episode loads the variation again with its gold path and replays the actions so far.

The split table (``SPLITS``) is the package's, read from the JVM for scienceworld 1.2.3 and
checked against it by the tests; with another scienceworld version it is read from the JVM once
and cached in ``$AGENTGYM_CACHE`` (default ``~/.cache/agentgym``).
"""

from __future__ import annotations

import functools
import json
import os
import random
import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentgym.envpool.base import SPLITS as SPLIT_NAMES
from agentgym.envpool.base import Env, StepResult

SPLITS_VERSION = "1.2.3"
# Kept packed by hand (not formatted): a table reads as one block, not a task a line.
SPLITS: dict[str, tuple[int, int, int]] = {
    # task name: (end of train, end of dev, number of variations); train = [0, a), dev = [a, b), test = [b, n)
    "boil": (14, 21, 30), "melt": (14, 21, 30), "freeze": (14, 21, 30),
    "change-the-state-of-matter-of": (14, 21, 30), "use-thermometer": (270, 405, 540),
    "measure-melting-point-known-substance": (218, 327, 436),
    "measure-melting-point-unknown-substance": (150, 225, 300), "power-component": (10, 15, 20),
    "power-component-renewable-vs-nonrenewable-energy": (10, 15, 20), "test-conductivity": (450, 675, 900),
    "test-conductivity-of-unknown-substances": (300, 450, 600), "find-living-thing": (150, 225, 300),
    "find-non-living-thing": (150, 225, 300), "find-plant": (150, 225, 300), "find-animal": (150, 225, 300),
    "grow-plant": (62, 93, 126), "grow-fruit": (62, 93, 126), "chemistry-mix": (16, 24, 32),
    "chemistry-mix-paint-secondary-color": (18, 27, 36), "chemistry-mix-paint-tertiary-color": (18, 27, 36),
    "lifespan-longest-lived": (62, 93, 125), "lifespan-shortest-lived": (62, 93, 125),
    "lifespan-longest-lived-then-shortest-lived": (62, 93, 125), "identify-life-stages-1": (6, 9, 14),
    "identify-life-stages-2": (4, 6, 10), "inclined-plane-determine-angle": (84, 126, 168),
    "inclined-plane-friction-named-surfaces": (692, 1038, 1386),
    "inclined-plane-friction-unnamed-surfaces": (80, 120, 162), "mendelian-genetics-known-plant": (60, 90, 120),
    "mendelian-genetics-unknown-plant": (240, 360, 480),
}  # fmt: skip

# Kept packed by hand (not formatted): a word list reads as one block, not a word a line.
ACTION_FORMS = (
    "look around", "look at OBJ", "look in OBJ", "read OBJ", "open OBJ", "close OBJ", "activate OBJ",
    "deactivate OBJ", "connect OBJ to OBJ", "disconnect OBJ", "use OBJ [on OBJ]", "pick up OBJ",
    "put down OBJ", "move OBJ to OBJ", "pour OBJ into OBJ", "dunk OBJ into OBJ", "mix OBJ", "go to LOC",
    "teleport to LOC", "eat OBJ", "flush OBJ", "focus on OBJ", "wait", "wait1", "inventory", "task",
)  # fmt: skip
"""ScienceWorld's action templates, as its help lists them."""

_ACTION = re.compile(r"action\s*:\s*", re.IGNORECASE)


class JavaNotFound(RuntimeError):
    """No usable ``java`` (17 or newer) for the ScienceWorld simulator."""


def check_java() -> str:
    """Path of a Java 17+ ``java``; ``JavaNotFound`` naming what to install otherwise."""
    java = shutil.which("java")
    hint = "install the Debian package openjdk-17-jre-headless (scripts/install.sh does) or put Java 17+ on PATH"
    if java is None:
        raise JavaNotFound(f"sciworld: the ScienceWorld simulator is a JVM program and no `java` is on PATH; {hint}")
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise JavaNotFound(f"sciworld: `{java} -version` failed ({exc}); {hint}") from exc
    m = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    major = int(m.group(1)) if m else 0
    if major == 1 and m and m.group(2):  # "1.8.0" is Java 8
        major = int(m.group(2))
    if major < 17:
        raise JavaNotFound(f"sciworld: {java} is Java {major or '?'}; ScienceWorld needs Java 17+; {hint}")
    return java


def task_order() -> list[str]:
    """All task names in the package's order (no JVM needed)."""
    from scienceworld.constants import TASKS
    from scienceworld.utils import infer_task

    return [infer_task(t["task_name"]) for t in TASKS]


def _selected(task_names: str) -> list[str]:
    names = task_order()
    if not task_names.strip():
        return names
    chosen = [n.strip() for n in task_names.split(",") if n.strip()]
    unknown = [n for n in chosen if n not in names]
    if unknown:
        raise ValueError(f"sciworld: unknown task name(s) {unknown} in option task_names; tasks are {names}")
    return [n for n in names if n in chosen]  # package order, duplicates dropped


@functools.lru_cache(maxsize=1)
def split_table() -> dict[str, tuple[int, int, int]]:
    """``SPLITS`` for the installed scienceworld (read from its JVM and cached if not 1.2.3)."""
    from scienceworld.version import __version__

    if __version__ == SPLITS_VERSION:
        return SPLITS
    cache = (
        Path(os.environ.get("AGENTGYM_CACHE", Path.home() / ".cache" / "agentgym"))
        / f"sciworld-splits-{__version__}.json"
    )
    if cache.exists():
        return {k: tuple(v) for k, v in json.loads(cache.read_text()).items()}
    table = read_splits_from_jvm()
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(table))
    tmp.replace(cache)
    return table


def read_splits_from_jvm(names: Sequence[str] | None = None, server: Any = None) -> dict[str, tuple[int, int, int]]:
    """Ask the simulator for each task's train/dev/test variations (starts a JVM unless given one)."""
    env = None
    if server is None:
        env = _start_jvm(384, "-XX:+UseSerialGC")
        server = env.server
    table = {}
    try:
        for name in names or task_order():
            server.load(name, 0, "", False)
            train, dev, test = (
                list(f()) for f in (server.getVariationsTrain, server.getVariationsDev, server.getVariationsTest)
            )
            n = int(server.getTaskMaxVariations(name))
            if (
                train != list(range(len(train)))
                or dev != list(range(len(train), len(train) + len(dev)))
                or test != list(range(len(train) + len(dev), n))
            ):
                raise RuntimeError(f"sciworld: task {name}: splits are not consecutive ranges; cannot number them")
            table[name] = (len(train), len(train) + len(dev), n)
    finally:
        if env is not None:
            env.close()
    return table


def _start_jvm(heap_mb: int, options: str) -> Any:
    check_java()
    from scienceworld import ScienceWorldEnv

    # py4j launches `java` with this process's environment; the JVM reads JAVA_TOOL_OPTIONS.
    jvm_opts = f"-Xmx{heap_mb}m {options}".strip()
    old = os.environ.get("JAVA_TOOL_OPTIONS")
    os.environ["JAVA_TOOL_OPTIONS"] = f"{old} {jvm_opts}" if old else jvm_opts
    try:
        return ScienceWorldEnv("", envStepLimit=1 << 30)
    finally:
        if old is None:
            os.environ.pop("JAVA_TOOL_OPTIONS", None)
        else:
            os.environ["JAVA_TOOL_OPTIONS"] = old


def _ranges(names: Sequence[str]) -> dict[str, list[tuple[str, int, int]]]:
    """Per split: (task, first variation, end) in numbering order."""
    table = split_table()
    out: dict[str, list[tuple[str, int, int]]] = {s: [] for s in SPLIT_NAMES}
    for name in names:
        a, b, n = table[name]
        out["train"].append((name, 0, a))
        out["dev"].append((name, a, b))
        out["test"].append((name, b, n))
    return out


def parse_action(text: str) -> str:
    """The command in an agent's reply: after the last "Action:", first non-empty line."""
    parts = _ACTION.split(text)
    tail = parts[-1] if len(parts) > 1 else text
    for line in tail.splitlines():
        if line.strip():
            return line.strip().strip("`").strip()
    return ""


class SciWorld(Env):
    name = "sciworld"

    def __init__(
        self,
        task_names: str = "",
        simplifications: str = "",
        jvm_heap_mb: int = 384,
        jvm_options: str = "-XX:+UseSerialGC",
        **kwargs: object,
    ) -> None:
        super().__init__(**kwargs)
        if not isinstance(jvm_heap_mb, int) or jvm_heap_mb < 64:
            raise ValueError(f"sciworld: option jvm_heap_mb must be an integer >= 64, got {jvm_heap_mb!r}")
        self.names = _selected(task_names)
        self.simplifications = simplifications
        self._env = _start_jvm(jvm_heap_mb, jvm_options)
        self._server = self._env.server
        possible = ["easy", *self._server.getPossibleSimplifications().split(", ")]
        bad = [s for s in simplifications.split(",") if s and s not in possible]
        if bad:
            self.close()
            raise ValueError(f"sciworld: unknown simplification(s) {bad} in option simplifications; known: {possible}")
        self._task: tuple[str, int] | None = None
        self._description = ""
        self._score = 0.0
        self._done = False
        self._gold: list[str] | None = None
        self._gold_at = 0
        self._history: list[str] = []

    @classmethod
    def tasks(cls, split: str = "train", **options: object) -> Sequence[int]:
        if split not in SPLIT_NAMES:
            raise ValueError(f"env sciworld: unknown split {split!r}; splits are {list(SPLIT_NAMES)}")
        names = tuple(_selected(str(options.get("task_names", ""))))
        start, stop = _numbering(names)[split]
        return range(start, stop)

    def describe(self, task_id: int) -> tuple[str, int]:
        """(task name, variation) of ``task_id`` under this env's options."""
        return describe(task_id, tuple(self.names))

    def reset(self, task_id: int) -> str:
        name, variation = self.describe(task_id)
        # No gold path here: generating it costs ~1 s per load; the expert asks for it (see expert_action).
        self._server.load(name, variation, self.simplifications, False)
        self._task = (name, variation)
        self._description = str(self._server.getTaskDescription())
        self._score, self._done = 0.0, False
        self._gold, self._gold_at, self._history = None, 0, []
        return str(self._server.step("look around"))

    def instructions(self) -> str:
        return (
            "You are an agent in ScienceWorld, a text simulation of a house, its garden and the outside. "
            f"{self._description}\n"
            "Act with one command per turn, for example: " + "; ".join(ACTION_FORMS) + ". "
            "OBJ and LOC are things and places you have seen. If a command is ambiguous you get numbered "
            "choices: answer with the number. Reply with the command alone, or end your reply with "
            "'Action: <command>'."
        )

    def step(self, action: str) -> StepResult:
        if self._task is None:
            return StepResult("No task: the episode has not started.", 0.0, False, {})
        if self._done:
            return StepResult("The task is over.", 0.0, True, {"score": self._score, "success": self._score >= 1.0})
        command = parse_action(action)
        if self._gold is not None and self._gold_at < len(self._gold) and command == self._gold[self._gold_at]:
            self._gold_at += 1
        if not command:
            return StepResult("No known action matches that input.", 0.0, False, {"score": round(self._score * 100)})
        self._history.append(command)
        obs = str(self._server.step(command))
        raw = float(self._server.getScore())
        completed = bool(self._server.getCompleted())
        score = min(1.0, max(0.0, raw))
        reward = score - self._score
        self._score = score
        self._done = completed or raw < 0
        info: dict[str, Any] = {"score": round(score * 100), "moves": int(self._server.getNumMoves())}
        if self._done:
            info["success"] = completed and raw >= 1.0
            info["failed"] = raw < 0
        return StepResult(obs, reward, self._done, info)

    def random_action(self, rng: random.Random) -> str:
        # The simulator enumerates the commands valid where the agent is (every template filled
        # with every object in view): one of them, uniformly.
        if self._task is None:
            return "look around"
        valid = sorted(str(a) for a in self._server.getValidActionObjectCombinations())
        return rng.choice(valid) if valid else "look around"

    def expert_action(self) -> str:
        if self._task is None:
            return "look around"
        if self._gold is None:
            # Load the variation again, this time with its gold path, and replay the episode so far
            # (ScienceWorld is deterministic for a variation): the simulator is where it was.
            name, variation = self._task
            self._server.load(name, variation, self.simplifications, True)
            self._server.step("look around")
            for command in self._history:
                self._server.step(command)
            self._gold = [str(a) for a in self._server.getGoldActionSequence()]
            for command in self._history:
                if self._gold_at < len(self._gold) and command == self._gold[self._gold_at]:
                    self._gold_at += 1
        if self._gold_at < len(self._gold):
            return self._gold[self._gold_at]
        return "look around"

    def close(self) -> None:
        env, self._env = getattr(self, "_env", None), None
        if env is not None:
            env.close()
            proc = env._gateway.java_process
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


@functools.lru_cache(maxsize=64)
def _numbering(names: tuple[str, ...]) -> dict[str, tuple[int, int]]:
    """[start, stop) of each split's task ids: train first, then dev, then test."""
    spans, start = {}, 0
    for split, parts in _ranges(names).items():
        n = sum(hi - lo for _, lo, hi in parts)
        spans[split] = (start, start + n)
        start += n
    return spans


def describe(task_id: int, names: Sequence[str] | str = "") -> tuple[str, int]:
    """(task name, variation) of ``task_id`` among the tasks ``names`` (a list, or the option's string)."""
    names = tuple(_selected(names) if isinstance(names, str) else names)
    spans = _numbering(names)
    for split, (start, stop) in spans.items():
        if start <= task_id < stop:
            k = task_id - start
            for name, lo, hi in _ranges(names)[split]:
                if k < hi - lo:
                    return name, lo + k
                k -= hi - lo
    total = max(stop for _, stop in spans.values())
    raise ValueError(f"sciworld: task id {task_id} out of range: the selected tasks have ids 0..{total - 1}")


def task_id_of(name: str, variation: int, task_names: str = "") -> int:
    """The task id of (task ``name``, ``variation``) under the option ``task_names``."""
    names = tuple(_selected(task_names))
    if name not in names or not 0 <= variation < split_table()[name][2]:
        raise ValueError(f"sciworld: no task {name!r} variation {variation} among the selected tasks")
    spans = _numbering(names)
    for split, parts in _ranges(names).items():
        k = spans[split][0]
        for task, lo, hi in parts:
            if task == name and lo <= variation < hi:
                return k + variation - lo
            k += hi - lo
    raise AssertionError((name, variation))
