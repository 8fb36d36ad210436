"""``maze``: walk from the start to the goal of a grid maze (after the lmrlgym maze of AgentGym).

A perfect maze (one path between any two cells: randomised depth-first carving) of ``size`` x
``size`` cells is generated from the task id, with a random start and a goal at least half the
maze's longest path away. Each observation gives the agent's position, the goal's, and which of
the four directions are open; with ``show_map`` it also draws the whole maze:

    #########
    #A  #   #        A = you, G = goal, # = wall
    ### # # #
    #   # #G#
    #########

    options:  size: int = 5 (2..30)   cells per side
              show_map: bool = False   the drawn maze in every observation
              layout: int | None = None   one maze for every task, carved from this seed (the
                                          start and goal still vary by task): a known map, where
                                          the right move is a function of where the agent and
                                          the goal are; None: a new maze per task, which the
                                          agent must explore (only the open sides are shown)
              progress_reward: bool | str = False   also reward each move by the progress it
                                          makes: true (or "path"): (d_before - d_after) / d_start,
                                          d the length of the maze's path to the goal; the moves
                                          of an episode sum to the share of the way it covered (1
                                          at the goal), a move back takes its share away, a wall
                                          or an unknown command gives 0. "record": only a move
                                          that brings the agent nearer the goal than it has been
                                          this episode is paid, (d_best - d_after) / d_start; a
                                          wrong turn, the way back out of it and a walk over
                                          known ground earn 0 (with "path", going back out of a
                                          dead end is paid as much as the wrong turn cost, so
                                          back-and-forth is paid too). Both sum to 1 at the goal.
                                          Success is still only reaching the goal.
              train_sizes: list[int] | None = None   a curriculum of sizes: a training task's
                                          maze has train_sizes[task_id % len(train_sizes)] cells
                                          per side, a dev or test task's has ``size``; the
                                          held-out evaluation stays at ``size`` while training
                                          mixes in smaller mazes, where a random walk finds the
                                          goal often enough for RL to learn from
              read_actions: str = "exact"   "exact": the reply is the action; "first": the first
                                          "move <dir>" or "go <dir>" in the reply counts, for a
                                          model that answers in a sentence (envpool/actions.py)
    actions:  move up | move down | move left | move right   ("up" etc. alone is accepted too)
    reward:   1 on reaching the goal (done, success), plus the progress above if asked; a move
              into a wall keeps the agent in place and says so; an unknown command gets the
              action list. Both count as a turn. The env has no turn limit of its own: the
              actor applies the learner's.
    expert:   breadth-first search from the agent to the goal.

Rows are numbered from the top, columns from the left, both from 1.
"""

from __future__ import annotations

import collections
import random

from agentgym.envpool.actions import check_read, first_action
from agentgym.envpool.base import Env, StepResult, curriculum_option, for_task, int_in

MOVES = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
"""Direction -> (row, column) change."""
_PHRASES = {f"{verb} {d}": d for verb in ("move", "go") for d in MOVES}
"""The phrases ``read_actions = "first"`` looks for in a reply, and the direction each names."""
OPPOSITE = {"up": "down", "down": "up", "left": "right", "right": "left"}
"""Direction -> the one that goes straight back."""

Cell = tuple[int, int]


def carve(size: int, rng: random.Random) -> dict[Cell, set[str]]:
    """A perfect maze: for each cell the directions that are open (iterative DFS carving)."""
    opened: dict[Cell, set[str]] = {(r, c): set() for r in range(size) for c in range(size)}
    start = (rng.randrange(size), rng.randrange(size))
    stack, seen = [start], {start}
    while stack:
        r, c = stack[-1]
        options = [(d, (r + dr, c + dc)) for d, (dr, dc) in MOVES.items() if (r + dr, c + dc) in opened]
        options = [(d, cell) for d, cell in options if cell not in seen]
        if not options:
            stack.pop()
            continue
        d, cell = rng.choice(options)
        opened[(r, c)].add(d)
        opened[cell].add(OPPOSITE[d])
        seen.add(cell)
        stack.append(cell)
    return opened


def distances(opened: dict[Cell, set[str]], source: Cell) -> dict[Cell, int]:
    """Steps from ``source`` to every cell (breadth-first)."""
    dist = {source: 0}
    queue = collections.deque([source])
    while queue:
        r, c = queue.popleft()
        for d in opened[(r, c)]:
            dr, dc = MOVES[d]
            nxt = (r + dr, c + dc)
            if nxt not in dist:
                dist[nxt] = dist[(r, c)] + 1
                queue.append(nxt)
    return dist


def draw(opened: dict[Cell, set[str]], size: int, me: Cell, goal: Cell) -> str:
    rows = [["#"] * (2 * size + 1) for _ in range(2 * size + 1)]
    for (r, c), dirs in opened.items():
        rows[2 * r + 1][2 * c + 1] = " "
        for d in dirs:
            dr, dc = MOVES[d]
            rows[2 * r + 1 + dr][2 * c + 1 + dc] = " "
    rows[2 * goal[0] + 1][2 * goal[1] + 1] = "G"
    rows[2 * me[0] + 1][2 * me[1] + 1] = "A"
    return "\n".join("".join(row) for row in rows)


class Maze(Env):
    name = "maze"

    def __init__(
        self,
        size: int = 5,
        show_map: bool = False,
        layout: int | None = None,
        progress_reward: bool | str = False,
        train_sizes: list[int] | None = None,
        read_actions: str = "exact",
        **kwargs: object,
    ) -> None:
        super().__init__(**kwargs)
        self.read_actions = check_read("maze", read_actions)
        if not int_in(size, 2, 30):
            raise ValueError(f"maze: option size must be an integer from 2 to 30, got {size!r}")
        self.train_sizes = curriculum_option("maze", "train_sizes", train_sizes, 2, 30)
        if not isinstance(show_map, bool):
            raise TypeError(f"maze: option show_map must be true or false, got {show_map!r}")
        if layout is not None and (not isinstance(layout, int) or isinstance(layout, bool)):
            raise TypeError(f"maze: option layout must be an integer seed or absent, got {layout!r}")
        if not (isinstance(progress_reward, bool) or progress_reward in ("path", "record")):
            raise ValueError(
                f'maze: option progress_reward must be false, true, "path" or "record", got {progress_reward!r}'
            )
        self.size, self.show_map, self.layout = size, show_map, layout
        self.progress_reward = "path" if progress_reward is True else (progress_reward or "")
        """The progress paid: "" (none), "path" or "record"."""
        self._n = size  # the current task's cells per side
        self._opened: dict[Cell, set[str]] = {}
        self._me: Cell = (0, 0)
        self._goal: Cell = (0, 0)
        self._to_goal: dict[Cell, int] = {}
        self._start_distance = 1
        self._best = 1  # the nearest the agent has been to the goal this episode
        self._turns = 0
        self._done = True

    def size_of(self, task_id: int) -> int:
        """Cells per side of ``task_id``'s maze (``size``, or the curriculum's for a training task)."""
        return for_task(self.train_sizes, task_id, self.size)

    def reset(self, task_id: int) -> str:
        n = self._n = self.size_of(task_id)
        rng = random.Random(f"maze/{n}/{task_id}")
        self._opened = carve(n, rng if self.layout is None else random.Random(f"maze-layout/{n}/{self.layout}"))
        self._me = (rng.randrange(n), rng.randrange(n))
        dist = distances(self._opened, self._me)
        far = max(dist.values())
        self._goal = rng.choice(sorted(cell for cell, d in dist.items() if d >= max(1, far // 2)))
        self._to_goal = distances(self._opened, self._goal)  # the expert's map, computed once
        self._start_distance = self._best = self._to_goal[self._me]  # >= 1: the goal is never the start
        self._turns = 0
        self._done = False
        return self._describe()

    def instructions(self) -> str:
        return (
            f"You are in a maze of {self._n} by {self._n} cells; rows count from the top, columns "
            "from the left, both from 1. Reach the goal. Each turn answer with one action: "
            "move up, move down, move left or move right."
        )

    def _where(self, cell: Cell) -> str:
        return f"row {cell[0] + 1}, column {cell[1] + 1}"

    def _describe(self) -> str:
        dirs = [d for d in MOVES if d in self._opened[self._me]]
        walls = [d for d in MOVES if d not in self._opened[self._me]]
        text = f"You are at {self._where(self._me)}. The goal is at {self._where(self._goal)}."
        text += f"\nOpen: {', '.join(dirs)}." + (f" Walls: {', '.join(walls)}." if walls else "")
        if self.show_map:
            text += "\n" + draw(self._opened, self._n, self._me, self._goal)
        return text

    def step(self, action: str) -> StepResult:
        if not self._opened or self._done:
            return StepResult("The episode is over.", 0.0, True, {"turns": self._turns, "success": False})
        self._turns += 1
        d = self._read(action)
        if d is None:
            text = f"Invalid action {action[:60]!r}. Choose one of: move up, move down, move left, move right."
            return StepResult(text, 0.0, False, {"turns": self._turns, "valid": False})
        if d not in self._opened[self._me]:
            return StepResult(f"You hit a wall.\n{self._describe()}", 0.0, False, {"turns": self._turns})
        dr, dc = MOVES[d]
        before = self._to_goal[self._me]
        self._me = (self._me[0] + dr, self._me[1] + dc)
        after = self._to_goal[self._me]
        gained = {"path": before - after, "record": max(0, self._best - after)}.get(self.progress_reward, 0)
        progress = gained / self._start_distance
        self._best = min(self._best, after)
        if self._me == self._goal:
            self._done = True
            text = f"You reached the goal at {self._where(self._goal)}!"
            return StepResult(text, 1.0 + progress, True, {"turns": self._turns, "success": True})
        return StepResult(f"You moved {d}.\n{self._describe()}", progress, False, {"turns": self._turns})

    def _read(self, action: str) -> str | None:
        """The direction ``action`` names, or None (``read_actions`` says how it is read)."""
        words = action.lower().strip().rstrip(".").split()
        if words[:1] == ["move"] or words[:1] == ["go"]:
            words = words[1:]
        if len(words) == 1 and words[0] in MOVES:
            return words[0]
        return first_action(action, _PHRASES) if self.read_actions == "first" else None

    def random_action(self, rng: random.Random) -> str:
        # A move through one of the open sides the observation lists, uniformly: random play that
        # reads what it is shown (as TextCraft's fills commands from the book it shows, and
        # SciWorld's picks among the valid commands), never where the goal is.
        if not self._opened or self._done:
            return f"move {rng.choice(sorted(MOVES))}"
        return f"move {rng.choice(sorted(self._opened[self._me]))}"

    def expert_action(self) -> str:
        # Breadth-first distances to the goal were computed at reset: step to a neighbour nearer.
        r, c = self._me
        for d in sorted(self._opened.get(self._me, ())):
            dr, dc = MOVES[d]
            if self._to_goal[(r + dr, c + dc)] < self._to_goal[self._me]:
                return f"move {d}"
        return "move up"  # only when the episode is over: the agent is on the goal
