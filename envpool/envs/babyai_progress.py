"""How many actions a BabyAI mission still needs: the distance behind ``babyai``'s progress reward.

    d = actions_to_go(env)      # minigrid env of a GoTo or Pickup mission; None: not reachable

The distance is a breadth-first search over the agent's states (cell, facing) with the three
moves that change them (turn left, turn right, go forward onto a cell that can be entered), to
the nearest state that faces an object the mission names; a Pickup mission needs one action more
(the pick up). It is the maze's path length for a grid world, so a progress reward built on it
(``(d_before − d_after) / d_start`` per step, envpool/envs/babyai.py) pays each action its share
of the way and takes it back for a step away. Only missions whose success is facing (GoTo) or
picking up (Pickup) one of a set of objects have such a distance; the others are refused by
name (``supported``). Closed doors count as walls: the single-room levels the reward is for have
none on the way.
"""

from __future__ import annotations

import collections
from typing import Any

_VEC = ((1, 0), (0, 1), (-1, 0), (0, -1))
"""minigrid's direction -> (dx, dy): 0 right, 1 down, 2 left, 3 up."""


def _instr_kind(env: Any) -> str | None:
    name = type(getattr(env, "instrs", None)).__name__
    return {"GoToInstr": "goto", "PickupInstr": "pickup"}.get(name)


def supported(env: Any) -> bool:
    """True when the env's mission is a GoTo or a Pickup instruction (it has a distance)."""
    return _instr_kind(env) is not None


def _targets(env: Any) -> set[tuple[int, int]]:
    """Cells holding an object the mission names (a carried object is in no cell)."""
    desc = env.instrs.desc
    desc.find_matching_objs(env)  # objects may have moved (picked up, dropped) since the reset
    return {(int(p[0]), int(p[1])) for p in desc.obj_poss if p is not None}


def actions_to_go(env: Any) -> int | None:
    """Actions the mission needs at least from the agent's state; None if no target is reachable
    (or, for Pickup, while the agent carries something: it must drop it first, not modelled)."""
    kind = _instr_kind(env)
    if kind is None:
        raise ValueError(
            f"babyai: progress_reward has no distance for the mission {env.mission!r} (only GoTo and Pickup missions)"
        )
    if kind == "pickup" and env.carrying is not None:
        return None
    targets = _targets(env)
    if not targets:
        return None
    grid, extra = env.grid, 1 if kind == "pickup" else 0
    start = (int(env.agent_pos[0]), int(env.agent_pos[1]), int(env.agent_dir))
    dist = {start: 0}
    queue = collections.deque([start])
    while queue:
        x, y, d = queue.popleft()
        dx, dy = _VEC[d]
        front = (x + dx, y + dy)
        if front in targets:
            return dist[(x, y, d)] + extra
        nxt = [(x, y, (d - 1) % 4), (x, y, (d + 1) % 4)]
        if 0 <= front[0] < grid.width and 0 <= front[1] < grid.height:
            cell = grid.get(*front)
            if cell is None or cell.can_overlap():
                nxt.append((front[0], front[1], d))
        for s in nxt:
            if s not in dist:
                dist[s] = dist[(x, y, d)] + 1
                queue.append(s)
    return None
