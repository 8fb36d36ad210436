"""Held-out tasks that a run also drew in training, found by replaying its draws (no model).

    python bench/task_overlap.py maze3 --seeds 0,1,2            # steps from the row's record
    python bench/task_overlap.py wordle-games --steps 100
    python bench/task_overlap.py --config configs/envs/mix.toml --tickets 1920   # an `agentgym train` run

The results table's RL runs (bench/learn_curve.py ``train_curve``) draw each step's training tasks
with ``train_task_ids``: ``learner.batch_groups`` ids a step, uniform over the config's
``env.task_start`` .. ``+ env.task_count``, from ``random.Random(run.seed)``; so a run's draws
follow from its config, seed and number of steps, and are replayed here, with the same function,
instead of being stored. Its held-out tasks are the first ``eval.tasks`` of the env's test split.
An ``agentgym train`` run draws per ticket instead (learner/control/scheduler.py ``ticket_task``: ticket n's
env and task from (run.seed, n)), so its draws are those of the tickets it issued (``--tickets``).

Two tasks are **identical** when an agent cannot tell them apart and the env would score the same
play the same way. Task ids are compared by playing them in the env:

1. the instructions and the first observation after ``reset(task_id)``;
2. the env's state right after the reset: its instance attributes that hold plain data (numbers,
   strings, and tuples, lists, sets, dicts and dataclasses of them), which is where an env keeps
   what the agent does not see (maze: the layout, the start and the goal; Wordle: the word;
   TextCraft: the book and its recipes). Attributes holding anything else (a simulator, a
   function, a random generator) are left out, so an env whose hidden state lives in such an
   object (BabyAI's minigrid env) is compared by 1 and 3 alone; so is an attribute that holds
   the task id itself (guess_number keeps it for its latency), which names a task, not what it is;
3. the scripted expert's whole play from there (``Env.expert_action`` until the episode ends or
   the row's turn limit): each action and the observation, reward and end it got.

So a maze task equals another when its layout, start and goal are the same (whatever its id), and a
Wordle game when its word is. Only the drawn ids whose 1 and 2 match a held-out task's are played
by the expert, so a row of a few thousand draws takes seconds.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
from pathlib import Path
from typing import Any

from agentgym.config import Config, EnvSpec, load_config
from agentgym.learner.control.scheduler import ticket_task


def train_task_ids(spec: EnvSpec, batch_groups: int, draw: random.Random) -> list[int]:
    """One step's training task ids (bench/learn_curve.py's loop draws with this)."""
    return [spec.task_start + draw.randrange(spec.task_count) for _ in range(batch_groups)]


def drawn(cfg: Config, steps: int) -> list[int]:
    """The training task ids of a run of ``cfg`` that trained ``steps`` steps, in draw order."""
    draw = random.Random(cfg.run.seed)
    spec = cfg.env.specs[0]
    return [t for _ in range(steps) for t in train_task_ids(spec, cfg.learner.batch_groups, draw)]


def ticket_drawn(cfg: Config, tickets: int) -> dict[str, list[int]]:
    """Env name -> the training task ids of an ``agentgym train`` run's first ``tickets`` tickets."""
    out: dict[str, list[int]] = {spec.name: [] for spec in cfg.env.specs}
    for n in range(tickets):
        spec, task = ticket_task(cfg.run.seed, n, cfg.env.specs)
        out[spec.name].append(task)
    return out


class _NotPlain(Exception):
    pass


def _plain(value: Any) -> Any:
    """``value`` as comparable plain data, or _NotPlain."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v) for v in value)
    if isinstance(value, (set, frozenset)):
        return ("set", tuple(sorted((_plain(v) for v in value), key=repr)))
    if isinstance(value, dict):
        return ("dict", tuple(sorted(((_plain(k), _plain(v)) for k, v in value.items()), key=repr)))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (
            type(value).__name__,
            tuple((f.name, _plain(getattr(value, f.name))) for f in dataclasses.fields(value)),
        )
    raise _NotPlain


def state(env: Any, skip: frozenset[str] = frozenset()) -> tuple:
    """The env's plain-data instance attributes but ``skip`` (2 of the module's definition)."""
    out = []
    for key, value in sorted(vars(env).items()):
        if key in skip:
            continue
        try:
            out.append((key, _plain(value)))
        except _NotPlain:
            continue
    return tuple(out)


def id_attributes(env: Any, ids: list[int]) -> frozenset[str]:
    """The attributes that hold the task id itself after ``reset`` of each of ``ids`` (distinct)."""
    held = None
    for task in ids:
        env.reset(task)
        mine = {k for k, v in vars(env).items() if isinstance(v, int) and not isinstance(v, bool) and v == task}
        held = mine if held is None else held & mine
    return frozenset(held or ())


def first_look(env: Any, task_id: int, skip: frozenset[str] = frozenset()) -> tuple:
    """1 and 2 of the module's definition for ``task_id``: what is compared before the expert plays."""
    obs = env.reset(task_id)
    return env.instructions(), obs, state(env, skip)


def expert_play(env: Any, task_id: int, limit: int) -> tuple:
    """3 of the module's definition: the expert's play of ``task_id`` from its reset."""
    env.reset(task_id)
    play = []
    for _ in range(limit):
        action = env.expert_action()
        res = env.step(action)
        play.append((action, res.observation, res.reward, res.done))
        if res.done:
            break
    return tuple(play)


def overlap(cfg: Config, steps: int, eval_tasks: int, env: str | None = None, draws: list[int] | None = None) -> dict:
    """How many of the first ``eval_tasks`` test tasks are identical to a training task that a run of
    ``cfg`` drew in ``steps`` steps (or to one of ``draws``, the ids drawn for ``env``, an env of the
    config's mix): ``{"overlap", "test_tasks", "drawn", "distinct", "test_ids"}`` (``test_ids``: the
    indices into the test split of those that were drawn)."""
    from agentgym.envpool.registry import resolve_env

    spec = next((s for s in cfg.env.specs if s.name == env), None) if env else cfg.env.specs[0]
    if spec is None:
        raise ValueError(f"task_overlap: env {env!r} is not in the config's envs {[s.name for s in cfg.env.specs]}")
    cls = resolve_env(spec.name)
    limit = cfg.schedule.for_env(spec.name).final_limit
    ids = list(cls.tasks("test", **spec.kwargs))
    tests = [int(ids[i % len(ids)]) for i in range(eval_tasks)]  # as EnvPool.task_id resolves them
    draws = drawn(cfg, steps) if draws is None else draws
    distinct = sorted(set(draws))
    game = cls(**spec.kwargs)
    try:
        skip = id_attributes(game, sorted({tests[0], *distinct[:2]}))
        looks: dict[tuple, list[int]] = {}
        for i, task in enumerate(tests):
            looks.setdefault(first_look(game, task, skip), []).append(i)
        plays: dict[int, tuple] = {}  # test index -> its expert play, computed when needed

        def play_of(i: int) -> tuple:
            if i not in plays:
                plays[i] = expert_play(game, tests[i], limit)
            return plays[i]

        found: set[int] = set()
        for task in distinct:
            same = [i for i in looks.get(first_look(game, task, skip), []) if i not in found]
            if same:
                mine = expert_play(game, task, limit)
                found.update(i for i in same if play_of(i) == mine)
            if len(found) == len(tests):
                break
    finally:
        game.close()
    return {
        "overlap": len(found),
        "test_tasks": len(tests),
        "drawn": len(draws),
        "distinct": len(distinct),
        "test_ids": sorted(found),
    }


def row_overlap(row: str, folder: Path) -> dict[int, dict]:
    """Seed -> ``overlap`` of each finished RL run in ``folder`` (a row's ``runs/results/<row>`` or
    its record), replayed with the row's config and the run's overrides, seed and steps."""
    from results import config  # noqa: PLC0415 (bench/results.py imports this module)

    out = {}
    for f in sorted(folder.glob("seed*.json")):
        run = json.loads(f.read_text())
        if run.get("partial"):
            continue
        steps = run.get("steps", len(run.get("metrics", [])))
        cfg = config(row, run["seed"], list(run.get("overrides", [])))
        out[run["seed"]] = overlap(cfg, steps, run.get("eval_tasks") or cfg.eval.tasks)
    return out


def main() -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from results import RECORD, config  # noqa: PLC0415

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("row", nargs="?", help="a row of bench/results.py (configs/envs/<row>.toml)")
    p.add_argument("--seeds", default=None, help="comma-separated seeds (default: the runs in --runs)")
    p.add_argument("--steps", type=int, default=None, help="steps trained (default: each run's, from --runs)")
    p.add_argument("--eval-tasks", type=int, default=None, help="held-out tasks (default: the config's eval.tasks)")
    p.add_argument("--runs", type=Path, default=None, help="the row's runs (default: docs/results-data/<row>)")
    p.add_argument(
        "--config", type=Path, default=None, help="instead of a row: an `agentgym train` config (with --tickets)"
    )
    p.add_argument("--tickets", type=int, default=None, help="training tickets the `agentgym train` run issued")
    p.add_argument("-o", "--override", action="append", default=[], help="config override (with --config)")
    args = p.parse_args()
    if args.config is not None:
        if args.tickets is None:
            raise SystemExit("task_overlap: --config needs --tickets (the training tickets the run issued)")
        cfg = load_config(args.config, args.override)
        for env, ids in ticket_drawn(cfg, args.tickets).items():
            r = overlap(cfg, 0, args.eval_tasks or cfg.eval.tasks, env=env, draws=ids)
            print(
                f"{args.config} {env}: {r['overlap']} of {r['test_tasks']} test tasks drawn in training "
                f"({r['drawn']} draws, {r['distinct']} distinct ids); test indices {r['test_ids']}"
            )
        return 0
    if args.row is None:
        raise SystemExit("task_overlap: give a row or --config")
    if args.steps is None:
        folder = args.runs or RECORD / args.row
        if not any(folder.glob("seed*.json")):
            raise SystemExit(f"task_overlap: no runs in {folder}; give --steps")
        res = row_overlap(args.row, folder)
        if args.seeds is not None:
            res = {s: r for s, r in res.items() if str(s) in args.seeds.split(",")}
    else:
        res = {}
        for seed in [int(s) for s in (args.seeds or "0").split(",")]:
            cfg = config(args.row, seed, [])
            res[seed] = overlap(cfg, args.steps, args.eval_tasks or cfg.eval.tasks)
    for seed, r in res.items():
        print(
            f"{args.row} seed {seed}: {r['overlap']} of {r['test_tasks']} test tasks drawn in training "
            f"({r['drawn']} draws, {r['distinct']} distinct ids); test indices {r['test_ids']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
