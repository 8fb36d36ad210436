"""What a maze agent can reach from what it is shown: success of simple policies without the map.

    python bench/maze_policies.py                       # maze 3x3 at 8 turns and 5x5 at 16, 2,000 test tasks
    python bench/maze_policies.py --size 5 --turns 16 --tasks 500

The maze's observation (envpool/envs/maze.py, without ``show_map``) gives the agent's cell, the
goal's, the open sides and the move just made; a new maze per task hides the rest. Each policy
below reads only the observation's text (``read``), as the model does, and keeps what it has
read before where it says so; every episode is the env's own ``reset`` and ``step``:

    random open    a uniformly random open side (the random arm and the base's random play)
    toward goal    an open side that brings the agent nearer the goal (row and column
                   distance), else any open side
    toward, no back the same, never straight back the way the last move came unless the cell is
                   a dead end: what the last observation's "You moved ..." allows
    least visited  the open side to the cell visited least so far (then nearer the goal): needs
                   the whole transcript, not only the last observation
    expert         the env's breadth-first expert (privileged: it knows the maze; the ceiling)

It sets what RL on a new maze per task can be expected to reach (docs/results.md, the maze rows).
"""

from __future__ import annotations

import argparse
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from agentgym.envpool.envs.maze import MOVES, OPPOSITE, Maze

Cell = tuple[int, int]
_WHERE = re.compile(r"You are at row (\d+), column (\d+)\. The goal is at row (\d+), column (\d+)\.")


@dataclass
class Seen:
    """What one observation says: the agent's cell, the goal's, the open sides, the last move."""

    me: Cell
    goal: Cell
    open: list[str]
    moved: str | None


def read(observation: str) -> Seen:
    """Parse a maze observation (the text the model reads); ValueError when it is not one."""
    where = _WHERE.search(observation)
    opened = re.search(r"Open: ([a-z, ]+)\.", observation)
    if where is None or opened is None:
        raise ValueError(f"maze_policies: not a maze observation: {observation[:80]!r}")
    r, c, gr, gc = (int(x) for x in where.groups())
    moved = re.match(r"You moved (\w+)\.", observation)
    return Seen((r, c), (gr, gc), opened.group(1).split(", "), moved.group(1) if moved else None)


@dataclass
class Memory:
    """What a policy may keep from the observations before (least visited uses it)."""

    visits: dict[Cell, int] = field(default_factory=dict)


Policy = Callable[[Seen, Memory, random.Random], str]


def _distance(a: Cell, b: Cell) -> int:
    return abs(a[0] - b[0]) + abs(a[1] - b[1])


def _after(seen: Seen, d: str) -> Cell:
    return seen.me[0] + MOVES[d][0], seen.me[1] + MOVES[d][1]


def _nearer(seen: Seen, dirs: list[str]) -> list[str]:
    return [d for d in dirs if _distance(_after(seen, d), seen.goal) < _distance(seen.me, seen.goal)]


def random_open(seen: Seen, memory: Memory, rng: random.Random) -> str:
    return rng.choice(seen.open)


def toward_goal(seen: Seen, memory: Memory, rng: random.Random) -> str:
    return rng.choice(_nearer(seen, seen.open) or seen.open)


def toward_no_back(seen: Seen, memory: Memory, rng: random.Random) -> str:
    dirs = [d for d in seen.open if seen.moved is None or d != OPPOSITE[seen.moved]] or seen.open
    return rng.choice(_nearer(seen, dirs) or dirs)


def least_visited(seen: Seen, memory: Memory, rng: random.Random) -> str:
    def key(d: str) -> tuple[int, int]:
        return memory.visits.get(_after(seen, d), 0), _distance(_after(seen, d), seen.goal)

    best = min(key(d) for d in seen.open)
    return rng.choice([d for d in seen.open if key(d) == best])


POLICIES: dict[str, Policy] = {
    "random open": random_open,
    "toward goal": toward_goal,
    "toward, no back": toward_no_back,
    "least visited": least_visited,
}


def success(policy: Policy | None, size: int, turns: int, tasks: list[int], seed: int = 0) -> float:
    """Share of ``tasks`` solved within ``turns`` moves; ``policy`` None plays the env's expert."""
    rng, solved = random.Random(seed), 0
    env = Maze(size=size)
    for task in tasks:
        observation, memory = env.reset(task), Memory()
        for _ in range(turns):
            seen = read(observation)
            memory.visits[seen.me] = memory.visits.get(seen.me, 0) + 1
            action = env.expert_action() if policy is None else f"move {policy(seen, memory, rng)}"
            result = env.step(action)
            if result.done:
                solved += bool(result.info.get("success"))
                break
            observation = result.observation
    return solved / len(tasks)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, help="one maze size (default: 3 at 8 turns and 5 at 16)")
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--tasks", type=int, default=2000, help="the first N tasks of the test split")
    args = ap.parse_args()
    setups = [(args.size, args.turns)] if args.size else [(3, 8), (5, 16)]
    print("| maze | turns | " + " | ".join(POLICIES) + " | expert |")
    print("|---|---|" + "---|" * (len(POLICIES) + 1))
    for size, turns in setups:
        tasks = list(Maze.tasks("test", size=size))[: args.tasks]
        rates = [success(p, size, turns, tasks) for p in [*POLICIES.values(), None]]
        print(f"| {size}x{size} | {turns} | " + " | ".join(f"{x:.2f}" for x in rates) + " |")


if __name__ == "__main__":
    main()
