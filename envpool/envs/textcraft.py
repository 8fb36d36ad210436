"""``textcraft``: craft a goal item from raw materials by following a recipe book (after TextCraft).

Each task is a small crafting world generated from the task id: a goal item whose recipe tree is
exactly ``depth`` crafts deep, plus ``distractors`` recipes that are not needed (some of them
use items of the goal's tree, as traps). Raw materials can be gathered in any amount; everything
else must be crafted. Item names come from fixed word lists (``RAW``, ``MATERIALS`` x ``THINGS``),
so no data files are needed, and a name never changes with the count ("4 oak planks", "1 oak
planks").

    options:  depth: int = 2 (1..5)    crafts between the raw materials and the goal
              distractors: int = 4 (0..20)
              train_distractors: list[int] | None = None   a curriculum of book sizes: a training
                                  task's book has train_distractors[task_id % len] distractors, a
                                  dev or test task's has ``distractors``
              progress_reward: bool = False   also reward each command by the progress it makes:
                                  the share of the expert's plan (its command count from the
                                  empty inventory) that the command saved; a command that undoes
                                  progress (spends an ingredient the goal needs on another craft)
                                  takes its share away
    reset ->  "Crafting commands:\\ncraft 4 oak planks using 1 oak log\\n...\\nGoal: craft iron lantern."
    actions:  get N ITEM                        (raw materials only)
              craft N ITEM using N ITEM, N ITEM  (N a multiple of the recipe's yield and the
                                                  ingredients scaled alike; any order)
              inventory
    reward:   1 when the goal item is crafted (done, success); every other turn 0. With
              progress_reward, every command's progress as well. An unknown command, item or
              recipe gets feedback naming the problem and counts as a turn.
              The env has no turn limit of its own: the actor applies the learner's.
    expert:   a planner over the recipe tree: gathers what is missing, crafts bottom-up.
"""

from __future__ import annotations

import collections
import itertools
import math
import random
import re
from dataclasses import dataclass

from agentgym.envpool.base import Env, StepResult, curriculum_option, for_task, int_in

# Kept packed by hand (not formatted), as the two lists below: a word list reads as one block, not a word a line.
RAW = (
    "oak log", "birch log", "spruce log", "cobblestone", "iron ore", "gold ore", "copper ore",
    "sand", "clay", "coal", "flint", "string", "feather", "leather", "wool", "reed", "quartz",
    "redstone dust", "bone", "wheat", "obsidian", "diamond", "slime ball", "honeycomb",
)  # fmt: skip
"""Raw materials: the only items ``get`` gives."""

MATERIALS = (
    "oak", "birch", "spruce", "stone", "iron", "golden", "copper", "glass", "clay", "woolen",
    "leather", "bone", "quartz", "obsidian", "diamond", "redstone",
)  # fmt: skip
THINGS = (
    "planks", "stick", "gear", "rod", "plate", "frame", "lens", "spring", "wire", "panel", "hinge",
    "bolt", "ring", "pipe", "valve", "lamp", "compass", "lantern", "clock", "bucket", "hammer",
    "pickaxe", "shovel", "saw", "chisel", "anvil", "chest", "barrel", "ladder", "door", "fence",
    "cart", "rail", "bow", "shield", "helmet", "boots", "banner", "bed", "table", "chair", "loom",
    "kiln", "beacon", "telescope", "kite", "flute", "drum", "crown", "mirror",
)  # fmt: skip
"""Crafted items are named "MATERIAL THING" (800 names)."""

MAX_COUNT = 1000  # larger counts in a command are refused (and int() of huge digit runs is slow)
_GET = re.compile(r"^get (\d{1,6}) (.+)$")
_CRAFT = re.compile(r"^craft (\d{1,6}) (.+?) using (.+)$")
_PART = re.compile(r"^(\d{1,6}) (.+)$")


@dataclass(frozen=True)
class Recipe:
    output: str
    count: int  # how many one craft yields
    ingredients: tuple[tuple[str, int], ...]  # (item, count) per craft, sorted by item

    def command(self, times: int = 1) -> str:
        parts = ", ".join(f"{n * times} {item}" for item, n in self.ingredients)
        return f"craft {self.count * times} {self.output} using {parts}"


@dataclass(frozen=True)
class World:
    goal: str
    recipes: dict[str, Recipe]  # output -> recipe, goal tree and distractors
    book: tuple[str, ...]  # the crafting commands shown, shuffled


def make_world(task_id: int, depth: int, distractors: int) -> World:
    """The crafting world of ``task_id`` (a pure function of its arguments)."""
    # A str seed is hashed with SHA-512 by random.Random: stable across runs and Python versions.
    rng = random.Random(f"textcraft/{depth}/{distractors}/{task_id}")
    names = [f"{m} {t}" for m in MATERIALS for t in THINGS]
    rng.shuffle(names)
    recipes: dict[str, Recipe] = {}

    def build(level: int) -> str:
        # An item `level` crafts above the raw materials: one ingredient one level down (so the
        # depth is exact), up to two more from any level below.
        name = names.pop()
        parts = {build(level - 1) if level > 1 else rng.choice(RAW): rng.randint(1, 3)}
        for _ in range(rng.randint(0, 2)):
            sub = rng.randrange(level)
            item = build(sub) if sub else rng.choice([r for r in RAW if r not in parts])
            parts.setdefault(item, rng.randint(1, 4))
        recipes[name] = Recipe(name, rng.choice((1, 1, 1, 2, 4)), tuple(sorted(parts.items())))
        return name

    goal = build(depth)
    known = list(recipes)
    for _ in range(distractors):
        name = names.pop()
        pool = [r for r in RAW] + known
        parts = {item: rng.randint(1, 3) for item in rng.sample(pool, rng.randint(1, 3))}
        recipes[name] = Recipe(name, rng.choice((1, 1, 2, 4)), tuple(sorted(parts.items())))
    book = [r.command() for r in recipes.values()]
    rng.shuffle(book)
    return World(goal, recipes, tuple(book))


def _count(text: str) -> int | None:
    n = int(text)
    return n if 1 <= n <= MAX_COUNT else None


class TextCraft(Env):
    name = "textcraft"

    def __init__(
        self,
        depth: int = 2,
        distractors: int = 4,
        progress_reward: bool = False,
        train_distractors: list[int] | None = None,
        **kwargs: object,
    ) -> None:
        super().__init__(**kwargs)
        for key, value, lo, hi in (("depth", depth, 1, 5), ("distractors", distractors, 0, 20)):
            if not int_in(value, lo, hi):
                raise ValueError(f"textcraft: option {key} must be an integer from {lo} to {hi}, got {value!r}")
        self.train_distractors = curriculum_option("textcraft", "train_distractors", train_distractors, 0, 20)
        if not isinstance(progress_reward, bool):
            raise TypeError(f"textcraft: option progress_reward must be true or false, got {progress_reward!r}")
        self.depth, self.distractors, self.progress_reward = depth, distractors, progress_reward
        self._plan_start = 1
        self._world: World | None = None
        self._inv: collections.Counter[str] = collections.Counter()
        self._turns = 0
        self._done = False

    def distractors_of(self, task_id: int) -> int:
        """Distractor recipes in ``task_id``'s book (``distractors``, or the curriculum's for a training task)."""
        return for_task(self.train_distractors, task_id, self.distractors)

    def reset(self, task_id: int) -> str:
        self._world = make_world(task_id, self.depth, self.distractors_of(task_id))
        self._inv = collections.Counter()
        self._turns = 0
        self._done = False
        self._plan_start = self.plan_length()
        return "Crafting commands:\n" + "\n".join(self._world.book) + f"\nGoal: craft {self._world.goal}."

    def instructions(self) -> str:
        return (
            "You craft items in a text world. Commands: 'get N ITEM' gathers a raw material; "
            "'craft N ITEM using N ITEM, N ITEM' crafts following one of the crafting commands "
            "(or a multiple of it); 'inventory' lists what you have. Only raw materials can be "
            "gathered. Craft the goal item."
        )

    def step(self, action: str) -> StepResult:
        if self._world is None or self._done:
            return StepResult("The episode is over.", 0.0, True, {"turns": self._turns, "success": False})
        if not self.progress_reward:
            return self._step(action)
        before = self.plan_length()
        result = self._step(action)
        after = 0 if result.done else self.plan_length()
        progress = (before - after) / self._plan_start
        return StepResult(result.observation, result.reward + progress, result.done, result.info)

    def plan_length(self) -> int:
        """How many commands the expert needs from the current inventory to craft the goal."""
        assert self._world is not None
        # The expert's commands, played by the env's own rules and then undone.
        saved, done = self._inv.copy(), self._done
        try:
            for n in itertools.count():
                action = self._plan(self._world.goal, 1)
                if action is None:
                    return n
                if m := _GET.match(action):
                    said = self._get(m.group(1), m.group(2))
                else:
                    m = _CRAFT.match(action)
                    assert m is not None
                    said = self._craft(m.group(1), m.group(2), m.group(3)).observation
                assert said.startswith(("Got ", "Crafted ")), (action, said)  # else the plan would never shrink
        finally:
            self._inv, self._done = saved, done
        raise AssertionError("unreachable")

    def _step(self, action: str) -> StepResult:
        self._turns += 1
        command = " ".join(action.lower().strip().rstrip(".").split())
        if command == "inventory":
            return self._reply(self._inventory())
        if m := _GET.match(command):
            return self._reply(self._get(m.group(1), m.group(2)))
        if m := _CRAFT.match(command):
            return self._craft(m.group(1), m.group(2), m.group(3))
        return self._reply(
            f"Could not understand {action[:80]!r}. Commands: get N ITEM, craft N ITEM using N ITEM, ..., inventory.",
            valid=False,
        )

    def _reply(self, text: str, *, valid: bool = True) -> StepResult:
        info: dict[str, str | int | float | bool] = {"turns": self._turns}
        if not valid:
            info["valid"] = False
        return StepResult(text, 0.0, False, info)

    def _inventory(self) -> str:
        items = [f"{n} {item}" for item, n in sorted(self._inv.items()) if n > 0]
        return "Inventory: " + (", ".join(items) if items else "empty") + "."

    def _get(self, count: str, item: str) -> str:
        n = _count(count)
        if n is None:
            return f"Could not get {count} {item}: the count must be from 1 to {MAX_COUNT}."
        if item not in RAW:
            if item in self._world.recipes:  # type: ignore[union-attr]  # reset() made the world
                return f"Could not get {item}: it is not a raw material; craft it."
            return f"Could not find {item}."
        self._inv[item] += n
        return f"Got {n} {item}."

    def _craft(self, count: str, item: str, using: str) -> StepResult:
        world = self._world
        assert world is not None
        recipe = world.recipes.get(item)
        if recipe is None:
            return self._reply(f"Could not find a recipe for {item}.")
        n = _count(count)
        parts: dict[str, int] = {}
        for part in using.split(","):
            m = _PART.match(part.strip())
            k = _count(m.group(1)) if m else None
            if m is None or k is None or m.group(2) in parts:
                return self._reply(
                    f"Could not understand the ingredient {part.strip()!r}: say N ITEM, N ITEM.", valid=False
                )
            parts[m.group(2)] = k
        if n is None or n % recipe.count:
            return self._reply(f"Could not craft {count} {item}: it is crafted in batches of {recipe.count}.")
        times = n // recipe.count
        if parts != {ing: k * times for ing, k in recipe.ingredients}:
            return self._reply(f"Could not craft {item}: wrong ingredients or amounts; see the crafting commands.")
        missing = [f"{k - self._inv[ing]} more {ing}" for ing, k in sorted(parts.items()) if self._inv[ing] < k]
        if missing:
            return self._reply(f"Could not craft {item}: you need {', '.join(missing)}.")
        self._inv.subtract(parts)
        self._inv[item] += n
        if item == world.goal:
            self._done = True
            return StepResult(f"Crafted {n} {item}. Goal reached!", 1.0, True, {"turns": self._turns, "success": True})
        return self._reply(f"Crafted {n} {item}.")

    def random_action(self, rng: random.Random) -> str:
        # Uniform over the command kinds, each filled from what the observation shows: the book's
        # crafting commands as written (the goal's tree no likelier than a distractor) or a raw
        # material the book names; never a plan.
        if self._world is None or self._done:
            return "inventory"
        kind = rng.randrange(3)
        if kind == 0:
            return "inventory"
        if kind == 1:
            raws = sorted({i for r in self._world.recipes.values() for i, _ in r.ingredients if i in RAW})
            return f"get {rng.randint(1, 4)} {rng.choice(raws)}"
        return rng.choice(self._world.book)

    def expert_action(self) -> str:
        if self._world is None or self._done:
            return "inventory"
        action = self._plan(self._world.goal, 1)
        assert action is not None  # the goal is not in the inventory while the episode runs
        return action

    def _plan(self, item: str, need: int) -> str | None:
        """The next command towards having ``need`` of ``item`` (None: already there). Ingredients
        are made depth-first; a shared raw material may be gathered twice, never too little."""
        missing = need - self._inv[item]
        if missing <= 0:
            return None
        if item in RAW:
            return f"get {missing} {item}"
        recipe = self._world.recipes[item]  # type: ignore[union-attr]  # reset() made the world
        times = math.ceil(missing / recipe.count)
        for ing, k in recipe.ingredients:
            action = self._plan(ing, k * times)
            if action is not None:
                return action
        return recipe.command(times)
