"""The game envs (babyai, textcraft, maze, wordle): the Env contract, determinism by task id,
experts that solve sampled tasks, invalid actions as turns, disjoint splits, and one expert
episode per env through the real EnvPool (worker subprocesses)."""

from __future__ import annotations

import asyncio
import importlib
import os
import random
import re
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from agentgym.envpool.base import Env, StepResult
from agentgym.envpool.envs.babyai import ACTIONS, BabyAI
from agentgym.envpool.envs.maze import MOVES, OPPOSITE, Maze, distances
from agentgym.envpool.envs.textcraft import RAW, TextCraft, make_world
from agentgym.envpool.envs.wordle import Wordle, feedback, load_words, split_of
from agentgym.envpool.pool import EnvFailure, EnvPool, EnvStartError
from agentgym.envpool.registry import resolve_env

# Single-room BabyAI levels keep the sampled expert episodes short; one multi-room level and one
# with doors and keys show the bot in step with the text wrapper there too.
BABYAI_LEVELS = ["GoToLocal", "PickupLoc", "PutNextLocal", "GoToObjMaze", "Unlock"]

_ENVS: dict[str, Env] = {}


def build(name: str) -> Env:
    return {
        "babyai": lambda: BabyAI(levels=BABYAI_LEVELS),
        "textcraft": lambda: TextCraft(depth=3),
        "maze": lambda: Maze(size=6),
        "wordle": Wordle,
    }[name]()


def _cached(name: str) -> Env:
    """One instance per env for the module (building BabyAI imports minigrid, Wordle reads its list)."""
    if name not in _ENVS:
        _ENVS[name] = build(name)
    return _ENVS[name]


NAMES = ["babyai", "textcraft", "maze", "wordle"]
INVALID = ["", "dance wildly", "x" * 5000, "🙂"]


def first_train_tasks(name: str, n: int) -> list[int]:
    return [int(t) for t in resolve_env(name).tasks("train")[:n]]


def play(env: Env, task_id: int, actions: Callable[[int], str] | None = None, max_turns: int = 400) -> list[str]:
    """A transcript: first observation, then action and observation per turn (expert by default)."""
    texts = [env.reset(task_id), env.instructions()]
    for turn in range(max_turns):
        action = actions(turn) if actions else env.expert_action()
        r = env.step(action)
        texts += [action, r.observation, f"{r.reward:.6f}", str(r.done)]
        if r.done:
            break
    return texts


def solve(env: Env, task_id: int, max_turns: int = 400) -> list[StepResult]:
    env.reset(task_id)
    results = []
    for _ in range(max_turns):
        results.append(env.step(env.expert_action()))
        if results[-1].done:
            return results
    raise AssertionError(f"{env.name} task {task_id}: expert not done in {max_turns} turns")


# ---------------------------------------------------------------- contract, common to all four


@pytest.mark.parametrize("name", NAMES)
def test_registered_by_name(name: str) -> None:
    assert resolve_env(name).name == name


@pytest.mark.parametrize("name", NAMES)
def test_reset_step_contract(name: str) -> None:
    env = _cached(name)
    task = first_train_tasks(name, 3)[2]
    first = env.reset(task)
    assert isinstance(first, str) and first
    assert isinstance(env.instructions(), str) and len(env.instructions()) > 40
    # Observations stay short enough for small models (a few hundred tokens at most).
    assert len(first) < 1500, first
    results = solve(env, task)
    for k, r in enumerate(results, start=1):
        assert isinstance(r, StepResult) and isinstance(r.observation, str) and r.observation
        assert r.info["turns"] == k and len(r.observation) < 1500
        assert r.done == (k == len(results))
    last = results[-1]
    assert last.info["success"] is True and last.reward > 0
    # After the end: done again, no second reward, no exception.
    after = env.step(env.expert_action())
    assert after.done and after.reward == 0.0 and after.info["success"] is False


@pytest.mark.parametrize("name", NAMES)
def test_same_task_id_same_episode(name: str) -> None:
    a, b = _cached(name), build(name)
    tasks = first_train_tasks(name, 4)
    for task in tasks:
        # The expert's episode, and a scripted one with invalid actions mixed in.
        assert play(a, task) == play(b, task)
        moves = {
            "babyai": list(ACTIONS),
            "textcraft": ["inventory", "get 2 oak log"],
            "maze": ["move up", "move left", "move down", "move right"],
            "wordle": ["crane", "slate", "guess: pious"],
        }[name]
        scripted = lambda turn, moves=moves: INVALID[1] if turn % 3 == 0 else moves[turn % len(moves)]  # noqa: E731
        assert play(a, task, scripted, 12) == play(b, task, scripted, 12)
    # Reusing an instance across other episodes changes nothing; task ids give different episodes.
    assert play(b, tasks[0]) == play(a, tasks[0])
    assert len({tuple(play(a, t)) for t in tasks}) == len(tasks)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("action", INVALID)
def test_invalid_action_is_feedback_and_a_turn(name: str, action: str) -> None:
    env = _cached(name)
    env.reset(first_train_tasks(name, 1)[0])
    for turn in (1, 2):
        r = env.step(action)
        assert (r.reward, r.done) == (0.0, False)
        assert r.info["turns"] == turn and r.info["valid"] is False
        assert r.observation and len(r.observation) < 400
    # The episode goes on: the expert still solves it from here.
    results = [env.step(env.expert_action())]
    while not results[-1].done:
        results.append(env.step(env.expert_action()))
    assert results[-1].info["success"] is True and results[-1].info["turns"] == 2 + len(results)


@pytest.mark.parametrize("name", NAMES)
def test_splits_are_disjoint(name: str) -> None:
    cls = resolve_env(name)
    splits = {s: cls.tasks(s) for s in ("train", "dev", "test")}
    assert all(len(ids) > 0 for ids in splits.values())
    for a, b in (("train", "dev"), ("train", "test"), ("dev", "test")):
        x, y = splits[a], splits[b]
        assert isinstance(x, range) and isinstance(y, range)  # ascending: disjoint by their bounds
        assert x[-1] < y[0] or y[-1] < x[0], (a, b)
    with pytest.raises(ValueError, match="unknown split 'val'"):
        cls.tasks("val")


@pytest.mark.parametrize("name", NAMES)
def test_bad_options_are_named(name: str) -> None:
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['sise'\]"):
        resolve_env(name)(sise=3)


# ---------------------------------------------------------------- babyai


def test_babyai_expert_solves_a_sample_of_levels_with_babyai_reward() -> None:
    env = _cached("babyai")
    assert isinstance(env, BabyAI)
    for task in range(2 * len(BABYAI_LEVELS)):
        results = solve(env, task)
        assert env._env.spec.id == f"BabyAI-{BABYAI_LEVELS[task % len(BABYAI_LEVELS)]}-v0"
        assert results[-1].info["success"] is True
        assert results[-1].reward == pytest.approx(1 - 0.9 * len(results) / env._env.max_steps)
        assert "Mission complete" in results[-1].observation


def test_babyai_text_view_and_agent_that_strays() -> None:
    env = BabyAI(levels="GoToLocal, Unlock")
    assert env.levels == ["BabyAI-GoToLocal-v0", "BabyAI-Unlock-v0"]
    first = env.reset(4)
    assert first.startswith("Your mission: go to the ") and "You are carrying nothing." in first
    assert "Your mission: go to the" in env.instructions()
    assert env.step("Turn Left.").observation.startswith("You turned left.")
    r = env.step("forward")
    assert "valid" not in r.info and r.observation.startswith(("You moved forward.", "You cannot move"))
    # An agent that does its own thing for a while: the expert takes over from wherever it is.
    for action in ["turn right", "pick up", "go forward", "toggle", "drop", "go forward", "turn left"]:
        r = env.step(action)
        if r.done:
            break
    while not r.done:
        r = env.step(env.expert_action())
    assert r.info["success"] is True
    text = env.reset(5)  # Unlock: a key to fetch, a locked door to open
    assert text.startswith("Your mission: open the ")
    results = solve(env, 5)
    assert results[-1].info["success"] is True
    said = " ".join(r.observation for r in results)
    assert "You picked up the " in said and "key" in said and "is now open" in said


def test_babyai_options_are_checked() -> None:
    with pytest.raises(ValueError, match=r"unknown level 'GoToNowhere'; known levels: .*GoToLocal"):
        BabyAI(levels=["GoToLocal", "GoToNowhere"])
    with pytest.raises(TypeError, match="option levels must be level names"):
        BabyAI(levels=[])


# ---------------------------------------------------------------- textcraft


def _tree_depth(world, item: str) -> int:  # noqa: ANN001
    recipe = world.recipes.get(item)
    return 0 if recipe is None else 1 + max(_tree_depth(world, ing) for ing, _ in recipe.ingredients)


@pytest.mark.parametrize("depth", [1, 2, 4])
def test_textcraft_depth_and_expert(depth: int) -> None:
    env = TextCraft(depth=depth, distractors=3)
    for task in range(12):
        world = make_world(task, depth, 3)
        assert _tree_depth(world, world.goal) == depth
        assert len(world.book) >= depth + 3
        results = solve(env, task, max_turns=200)
        assert results[-1].info["success"] is True and results[-1].reward == 1.0
        crafts = sum(1 for r in results if r.observation.startswith("Crafted"))
        assert crafts >= depth


def test_textcraft_feedback() -> None:
    env = TextCraft(depth=2, distractors=2)
    first = env.reset(7)
    world = make_world(7, 2, 2)
    assert first.startswith("Crafting commands:\n") and first.endswith(f"Goal: craft {world.goal}.")
    goal = world.recipes[world.goal]
    assert (
        env.step(f"get 1 {world.goal}").observation
        == f"Could not get {world.goal}: it is not a raw material; craft it."
    )
    assert env.step("get 3 unobtainium").observation == "Could not find unobtainium."
    assert env.step("get 0 sand").observation.startswith("Could not get 0 sand")
    missing = env.step(goal.command()).observation
    assert missing.startswith(f"Could not craft {world.goal}: you need ")
    assert env.step(f"craft 1 {world.goal} using 1 sand").observation.startswith(
        (f"Could not craft {world.goal}", "Could not craft 1")
    )
    # An unreadable ingredient list is a malformed command (valid: False); a craft that fails is not.
    bad = env.step(f"craft 1 {world.goal} using lots")
    assert bad.observation.startswith("Could not understand the ingredient 'lots'") and bad.info["valid"] is False
    assert "valid" not in env.step(goal.command()).info
    assert env.step(f"GET 2 {RAW[0]}.").observation == f"Got 2 {RAW[0]}."
    assert env.step("inventory").observation == f"Inventory: 2 {RAW[0]}."
    with pytest.raises(ValueError, match="depth must be an integer from 1 to 5, got 9"):
        TextCraft(depth=9)


def test_textcraft_progress_reward_pays_the_plan_share_and_taking_back_costs_it() -> None:
    undone = 0
    for task in range(40):
        plain, paid = TextCraft(depth=1, distractors=3), TextCraft(depth=1, distractors=3, progress_reward=True)
        assert paid.reset(task) == plain.reset(task)
        world, start = make_world(task, 1, 3), paid.plan_length()
        assert paid.step("inventory").reward == 0.0 and paid.step("dance").reward == 0.0
        # A distractor that spends a raw material the goal needs takes that progress back: get
        # the distractor's ingredients (enough of the goal's too: progress), then craft it.
        need = dict(world.recipes[world.goal].ingredients)
        trap = next(
            (
                r
                for r in world.recipes.values()
                if r.output != world.goal
                and all(i in RAW for i, _ in r.ingredients)
                and any(need.get(i, 1000) <= k for i, k in r.ingredients)
            ),
            None,
        )
        rewards = []
        if trap is not None:
            rewards += [paid.step(f"get {k} {ing}").reward for ing, k in trap.ingredients]
            assert sum(rewards) > 0
            spent = paid.step(trap.command())
            assert spent.observation.startswith("Crafted") and spent.reward == pytest.approx(-sum(rewards))
            rewards.append(spent.reward)
            undone += 1
        while not (r := paid.step(paid.expert_action())).done:
            rewards.append(r.reward)
            assert r.reward == pytest.approx(1 / start)  # each expert command saves one of the plan's
        assert r.info["success"] and r.reward == pytest.approx(1 + 1 / start)
        assert sum(rewards) + r.reward == pytest.approx(2.0)  # the whole plan (1) and the goal (1)
        assert [x.reward for x in solve(plain, task)] == [0.0] * (start - 1) + [1.0]
    assert undone >= 3  # the trap was sprung on several tasks
    with pytest.raises(TypeError, match="progress_reward must be true or false"):
        TextCraft(progress_reward="yes")


# ---------------------------------------------------------------- maze


def test_maze_expert_walks_the_shortest_path_and_walls_stop() -> None:
    env = Maze(size=7)
    for task in range(20):
        env.reset(task)
        shortest = distances(env._opened, env._me)[env._goal]
        assert len(solve(env, task)) == shortest
    first = env.reset(3)
    m = re.search(r"Walls: ([a-z, ]+)\.", first)
    if m:  # bump into a wall: same place, a turn, feedback
        wall = m.group(1).split(", ")[0]
        r = env.step(f"move {wall}")
        assert r.observation.startswith("You hit a wall.") and r.info["turns"] == 1
        assert r.observation.split("\n")[1] == first.split("\n")[0]
    drawn = Maze(size=3, show_map=True).reset(1)
    assert drawn.count("A") == 1 and drawn.count("G") == 1 and drawn.splitlines()[-1] == "#######"


def test_maze_progress_reward_pays_the_share_of_the_way_and_success_stays_the_goal() -> None:
    plain, paid = Maze(size=5), Maze(size=5, progress_reward=True)
    stepped_away = 0
    for task in range(10):
        assert paid.reset(task) == plain.reset(task)
        start, rewards = paid._to_goal[paid._me], []
        away = [d for d in sorted(paid._opened[paid._me]) if paid._to_goal[_moved(paid, d)] > start]
        if away:  # a step away costs its share, and the step back earns it again
            rewards += [paid.step(f"move {away[0]}").reward, paid.step(f"move {OPPOSITE[away[0]]}").reward]
            assert rewards == pytest.approx([-1 / start, 1 / start])
            stepped_away += 1
        wall = next((d for d in MOVES if d not in paid._opened[paid._me]), None)
        if wall:
            assert paid.step(f"move {wall}").reward == 0.0
        assert paid.step("dance").reward == 0.0
        while not (r := paid.step(paid.expert_action())).done:
            rewards.append(r.reward)
        assert r.info["success"] and r.reward == pytest.approx(1 + 1 / start)
        assert sum(rewards) + r.reward == pytest.approx(2.0)  # the whole way (1) and the goal (1)
        plain.reset(task)
        assert [plain.step(plain.expert_action()).reward for _ in range(start)] == [0.0] * (start - 1) + [1.0]
    assert stepped_away >= 3  # the step away and back was tried on several tasks
    for bad in (1, "yes"):
        with pytest.raises(ValueError, match='progress_reward must be false, true, "path" or "record", got'):
            Maze(size=5, progress_reward=bad)


def test_maze_record_progress_pays_only_new_ground_nearer_the_goal() -> None:
    path, record = Maze(size=5, progress_reward="path"), Maze(size=5, progress_reward="record")
    tried = 0
    for task in range(12):
        assert record.reset(task) == path.reset(task)
        start = record._to_goal[record._me]
        away = [d for d in sorted(record._opened[record._me]) if record._to_goal[_moved(record, d)] > start]
        if not away:
            continue
        tried += 1
        there_and_back = [f"move {away[0]}", f"move {OPPOSITE[away[0]]}"] * 2  # a wrong turn, twice
        assert [record.step(a).reward for a in there_and_back] == [0.0] * 4
        assert [path.step(a).reward for a in there_and_back] == pytest.approx([-1 / start, 1 / start] * 2)
        toward = record.expert_action()
        assert record.step(toward).reward == pytest.approx(1 / start)  # new ground, nearer: paid
        back = f"move {OPPOSITE[toward.split()[1]]}"
        assert [record.step(back).reward, record.step(toward).reward] == [0.0, 0.0]  # known ground: not again
        rewards = []
        while not (r := record.step(record.expert_action())).done:
            rewards.append(r.reward)
        assert r.info["success"] and sum(rewards) + r.reward == pytest.approx(2.0 - 1 / start)  # the rest, and 1
    assert tried >= 3


def _moved(env: Maze, d: str) -> tuple[int, int]:
    return env._me[0] + MOVES[d][0], env._me[1] + MOVES[d][1]


def test_maze_train_sizes_give_training_tasks_the_curriculum_and_held_out_tasks_size() -> None:
    maze = Maze(size=5, train_sizes=[3, 4])
    for task in range(6):  # training tasks: the curriculum's sizes by turns
        n = (3, 4)[task % 2]
        first = maze.reset(task)
        assert maze.size_of(task) == n and f"maze of {n} by {n} cells" in maze.instructions()
        rows = [int(r) for r in re.findall(r"row (\d+)", first)]
        assert rows and max(rows) <= n
        assert play(maze, task)[-1] == "True"  # the expert solves it
    for split in ("dev", "test"):  # held-out tasks: the size asked for, the same maze as without
        task = int(Maze.tasks(split)[3])
        assert maze.size_of(task) == 5 and maze.reset(task) == Maze(size=5).reset(task)
        assert "maze of 5 by 5 cells" in maze.instructions()
    for bad in ([], [1], [3, "4"], [True], 3):
        with pytest.raises(ValueError, match="train_sizes must be a non-empty list of integers from 2 to 30"):
            Maze(size=5, train_sizes=bad)  # type: ignore[arg-type]  # a wrong value on purpose: the error is what is tested


def test_textcraft_train_distractors_give_training_books_the_curriculum_and_held_out_books_distractors() -> None:
    env = TextCraft(depth=1, distractors=2, train_distractors=[0, 2])
    for task in range(6):  # training tasks: the curriculum's book sizes by turns
        n = (0, 2)[task % 2]
        book = env.reset(task).split("\n")[1:-1]
        assert env.distractors_of(task) == n and len(book) == 1 + n  # the goal's one recipe at depth 1
        assert book == list(make_world(task, 1, n).book)
        assert play(env, task)[-1] == "True"  # the expert solves it
    for split in ("dev", "test"):  # held-out tasks: the distractors asked for, the same world as without
        task = int(TextCraft.tasks(split)[3])
        assert env.distractors_of(task) == 2 and env.reset(task) == TextCraft(depth=1, distractors=2).reset(task)
    for bad in ([], [21], [1, "2"], [True], 2):
        with pytest.raises(ValueError, match="train_distractors must be a non-empty list of integers from 0 to 20"):
            TextCraft(depth=1, train_distractors=bad)  # type: ignore[arg-type]  # a wrong value on purpose: the error is what is tested


def test_list_options_reach_the_env_through_the_config_and_the_pool() -> None:
    from agentgym.config import load_config

    cfg = load_config(None, ['env.name="maze"', "env.kwargs={size=5, train_sizes=[3, 4]}"])
    assert cfg.env.kwargs == {"size": 5, "train_sizes": [3, 4]}

    async def main() -> str:
        async with EnvPool("maze", dict(cfg.env.kwargs), 1, step_timeout_s=30, reset_timeout_s=60) as pool:
            async with pool.episode(0) as ep:
                await ep.reset()
                return ep.instructions

    assert "maze of 3 by 3 cells" in asyncio.run(main())


def test_maze_layout_keeps_one_map_and_varies_start_and_goal() -> None:
    def plan(env: Maze, task: int) -> tuple[dict, tuple, tuple]:
        env.reset(task)
        return dict(env._opened), env._me, env._goal

    known = Maze(size=5, layout=3)
    plans = [plan(known, t) for t in range(30)]
    assert all(p[0] == plans[0][0] for p in plans)  # one map
    assert len({(p[1], p[2]) for p in plans}) > 10  # many starts and goals
    assert plan(Maze(size=5, layout=3), 7) == plans[7]  # deterministic by (layout, task)
    assert plan(Maze(size=5, layout=4), 0)[0] != plans[0][0]  # another seed, another map
    fresh = Maze(size=5)
    assert len({tuple(sorted((c, tuple(sorted(d))) for c, d in plan(fresh, t)[0].items())) for t in range(5)}) == 5
    for task in range(10):  # the expert still walks the shortest path on the shared map
        known.reset(task)
        shortest = distances(known._opened, known._me)[known._goal]
        assert len(solve(known, task)) == shortest
    with pytest.raises(TypeError, match="layout must be an integer seed"):
        Maze(size=5, layout="a")


def test_a_new_maze_is_solvable_from_what_the_observation_says(monkeypatch: pytest.MonkeyPatch) -> None:
    # bench/maze_policies.py reads only the observation text (cell, goal, open sides, last move):
    # heading for the goal through an open side, never straight back, solves most 3x3 tasks in 8
    # turns where a random open side solves few. The maze3 row's reachable ceiling rests on it.
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "bench"))
    policies = importlib.import_module("maze_policies")
    tasks = list(Maze.tasks("test", size=3))[:300]
    smart = policies.success(policies.toward_no_back, 3, 8, tasks)
    blind = policies.success(policies.random_open, 3, 8, tasks)
    assert smart >= 0.75 and blind <= 0.35 and policies.success(None, 3, 8, tasks) == 1.0, (smart, blind)
    with pytest.raises(ValueError, match="not a maze observation"):
        policies.read("You reached the goal at row 1, column 1!")


@pytest.mark.parametrize("read", ["exact", "first"])
def test_a_sentence_names_a_move_only_when_the_maze_reads_the_first_action(read: str) -> None:
    # Task 5 of a 3x3 maze starts at row 3, column 3 with up and left open: a sentence that says
    # "move up" before "left" moves up with read_actions = "first", and is an invalid turn otherwise.
    maze = Maze(size=3, read_actions=read)
    assert "Open: up, left." in maze.reset(5)
    said = maze.step("The goal is to the upper left, so I Move  Up and then go left.")
    if read == "first":
        assert said.observation.startswith("You moved up.") and "row 2, column 3" in said.observation
    else:
        assert said.observation.startswith("Invalid action") and said.info["valid"] is False
    # Words inside other words and a direction without its verb are no move in either mode.
    for reply in ("I am upset, the goal is left", "moveup"):
        result = maze.step(reply)
        assert result.info.get("valid") is False, (reply, result.observation)
    assert maze.step("left").observation.startswith("You moved left.")  # the plain forms still work
    with pytest.raises(ValueError, match="maze: option read_actions must be one of 'exact', 'first', got 'some'"):
        Maze(read_actions="some")


def test_babyai_reads_the_earliest_action_of_a_sentence_with_read_actions_first() -> None:
    first, exact = BabyAI(levels="GoToLocal", read_actions="first"), BabyAI(levels="GoToLocal")
    first.reset(3), exact.reset(3)
    # "go forward" comes before "turn left" in the reply: the agent moves ahead, not round.
    reply = "I should go forward to the key, and maybe turn left later."
    assert first.step(reply).observation.startswith("You moved forward.")
    assert exact.step(reply).info["valid"] is False
    assert first.step("Nothing to do here.").info["valid"] is False
    with pytest.raises(ValueError, match="babyai: option read_actions must be one of"):
        BabyAI(levels="GoToLocal", read_actions=True)


# ---------------------------------------------------------------- wordle


def test_wordle_feedback_marks() -> None:
    assert feedback("crane", "crane") == ("correct",) * 5
    assert feedback("speed", "abide") == ("absent", "absent", "present", "absent", "present")
    # A repeated letter is present only as often as the word has copies left over.
    assert feedback("eerie", "there") == ("present", "absent", "present", "absent", "correct")
    assert feedback("allee", "lapel") == ("present", "present", "present", "correct", "absent")
    assert feedback("lolly", "hello") == ("absent", "present", "correct", "correct", "absent")


def test_wordle_words_splits_and_expert() -> None:
    words = load_words()
    for split, listed in words.items():
        assert all(split_of(w) == split and re.fullmatch(r"[a-z]{5}", w) for w in listed)
    assert not set(words["train"]) & set(words["test"]) and not set(words["dev"]) & set(words["test"])
    env = _cached("wordle")
    assert isinstance(env, Wordle)
    test_ids = list(Wordle.tasks("test"))  # a few hundred ids
    assert {env.word(t) for t in test_ids} == set(words["test"])
    assert env.word(len(words["train"]) + 3) == env.word(3)  # train ids wrap
    with pytest.raises(ValueError, match=r"task id .* past the test split"):
        env.word(test_ids[-1] + 1)
    for task in test_ids[:10] + first_train_tasks("wordle", 10):
        results = solve(env, task)
        assert results[-1].info["success"] is True and len(results) <= 6
        assert results[-1].observation.endswith("correct! You found the word.")


def test_wordle_runs_out_of_guesses_and_reveals_the_word() -> None:
    env = Wordle(max_guesses=2)
    env.reset(10)
    word = env.word(10)
    wrong = next(w for w in ("crane", "slate", "pious") if w != word)
    r = env.step(wrong)
    assert r.observation.startswith(f"{wrong}: {wrong[0]} ") and r.observation.endswith("1 guess left.")
    assert env.step("notaword").info["guesses"] == 1  # a word not in the list uses no guess
    r = env.step(wrong)
    assert r.done and r.reward == 0.0 and r.observation.endswith(f"the word was {word}.")


def test_wordle_quiz_asks_for_the_word_only_after_a_lost_game() -> None:
    env = Wordle(max_guesses=2)
    env.reset(10)
    word = env.word(10)
    wrong = next(w for w in ("crane", "slate", "pious") if w != word)
    assert env.quiz() is None  # not over
    env.step(wrong)
    assert env.quiz() is None
    last = env.step(wrong).observation
    question, answer = env.quiz()
    # The last feedback as the game gave it, the word kept back and asked for.
    assert question == last.split(" No guesses left")[0] + " No guesses left. What was the word?" and answer == word
    assert word not in question
    env.reset(10)
    env.step(word)
    assert env.quiz() is None  # a won game hides nothing
    spelt = Wordle(max_guesses=1, letters=True)
    spelt.reset(10)
    spelt.step(wrong)
    assert spelt.quiz()[1] == " ".join(word)


def test_wordle_letters_mode_writes_and_reads_spaced_letters() -> None:
    small = "configs/envs/wordle-small.txt"
    env, plain = Wordle(word_list=small, max_guesses=2, letters=True), Wordle(word_list=small, max_guesses=2)
    word = env.word(5)
    assert "separated by spaces" in env.instructions() and "separated by spaces" not in plain.instructions()
    for e in (env, plain):  # either form is a guess in either mode
        e.reset(5)
        wrong = next(w for w in ("table", "chair") if w != word)
        r = e.step(" ".join(wrong))
        assert r.info["guesses"] == 1 and r.observation.endswith("1 guess left.")
        assert e.step("c h a i").info.get("valid") is False  # four letters: not a guess, no guess used
        assert e.step(f"{wrong[:4]} {wrong[4]}").info.get("valid") is False  # a word and a letter: neither form
        r = e.step(wrong)
        assert r.done and not r.info["success"]
        shown = " ".join(word) if e is env else word
        assert r.observation.startswith(f"{' '.join(wrong) if e is env else wrong}: ")
        assert r.observation.endswith(f"the word was {shown}.")
    rng = random.Random(0)
    env.reset(5)
    assert all(re.fullmatch(r"[a-z]( [a-z]){4}", env.random_action(rng)) for _ in range(20))
    results, action = [], ""
    env = Wordle(word_list=small, letters=True)
    env.reset(5)
    while not results or not results[-1].done:
        action = env.expert_action()
        assert re.fullmatch(r"[a-z]( [a-z]){4}", action)
        results.append(env.step(action))
    assert results[-1].info["success"] and action.replace(" ", "") == word
    with pytest.raises(TypeError, match="option letters must be true or false"):
        Wordle(word_list=small, letters="yes")  # type: ignore[arg-type]  # a wrong value on purpose: the error is what is tested


def test_wordle_missing_word_list_names_the_package(tmp_path: Path) -> None:
    missing = str(tmp_path / "american-english")
    with pytest.raises(FileNotFoundError, match=rf"word list {missing} not found; .*Debian package wamerican"):
        Wordle(word_list=missing)
    with pytest.raises(FileNotFoundError, match="wamerican"):
        Wordle.tasks("test", word_list=missing)
    few = tmp_path / "few.txt"
    few.write_text("apple\nmango\nKiwis\n")
    with pytest.raises(ValueError, match=r"too few 5-letter words for all splits"):
        Wordle(word_list=str(few))


# ---------------------------------------------------------------- through the real pool


@pytest.mark.parametrize("name", NAMES)
def test_expert_plays_through_the_env_pool(name: str) -> None:
    kwargs = {
        "babyai": {"levels": ",".join(BABYAI_LEVELS)},
        "textcraft": {"depth": 3},
        "maze": {"size": 6},
        "wordle": {},
    }[name]
    tasks = [int(resolve_env(name).tasks("test")[k]) for k in (0, 1)]

    async def main() -> list[list[str]]:
        async with EnvPool(name, kwargs, 2, step_timeout_s=30, reset_timeout_s=60) as pool:

            async def episode(task: int) -> list[str]:
                async with pool.episode(task) as ep:
                    texts = [await ep.reset()]
                    texts.append(ep.instructions)
                    for _ in range(400):
                        action = await ep.expert_action()
                        r = await ep.step(action)
                        texts += [action, r.observation, f"{r.reward:.6f}", str(r.done)]
                        if r.done:
                            assert r.info["success"] is True
                            return texts
                raise AssertionError(f"{name} task {task} not solved through the pool")

            out = await asyncio.gather(*(episode(t) for t in tasks))
            stats = pool.stats()
            assert stats["failures"] == {} and stats["episodes"] == 2 and stats["restarts"] == 0
            return list(out)

    through_pool = asyncio.run(main())
    in_process = resolve_env(name)(**kwargs)
    assert through_pool == [play(in_process, t) for t in tasks]


@pytest.mark.parametrize("name", NAMES)
def test_pool_survives_a_killed_and_a_hung_worker(name: str) -> None:
    kwargs = {
        "babyai": {"levels": ",".join(BABYAI_LEVELS)},
        "textcraft": {"depth": 2},
        "maze": {"size": 4},
        "wordle": {},
    }[name]
    task = first_train_tasks(name, 1)[0]

    async def main() -> None:
        async with EnvPool(name, kwargs, 1, step_timeout_s=3, reset_timeout_s=60) as pool:
            async with pool.episode(task) as ep:  # the worker dies mid-episode
                await ep.reset()
                os.kill(ep.worker_pid, signal.SIGKILL)
                with pytest.raises(EnvFailure) as err:
                    await ep.step(await ep.expert_action())
                assert err.value.reason == "crash"
            async with pool.episode(task) as ep:  # the worker stops answering
                await ep.reset()
                action = await ep.expert_action()
                os.kill(ep.worker_pid, signal.SIGSTOP)
                with pytest.raises(EnvFailure) as err:
                    await ep.step(action)
                assert err.value.reason == "timeout"
            async with pool.episode(task) as ep:  # a fresh worker plays the episode to the end
                await ep.reset()
                for _ in range(400):
                    r = await ep.step(await ep.expert_action())
                    if r.done:
                        break
                assert r.info["success"] is True
            stats = pool.stats()
            assert stats["failures"] == {"crash": 1, "timeout": 1} and stats["restarts"] == 2

    asyncio.run(main())


def test_pool_reports_bad_game_options() -> None:
    async def main() -> None:
        pool = EnvPool("wordle", {"length": 12}, 1)
        with pytest.raises(EnvStartError, match="option length must be an integer from 4 to 7, got 12"):
            await pool.start()

    asyncio.run(main())


def test_wordle_refuses_a_word_list_whose_dev_ids_would_reach_the_test_ids(tmp_path) -> None:
    import itertools
    import string

    from agentgym.envpool.envs.wordle import Wordle

    words = ("".join(t) for t in itertools.product(string.ascii_lowercase, repeat=4))
    path = tmp_path / "words"
    path.write_text("\n".join(itertools.islice(words, 260_000)))  # ~5% dev: ~13,000 > 10,000
    with pytest.raises(ValueError, match=r"dev words of 4 letters; dev task ids have room for 10000"):
        Wordle(length=4, word_list=str(path))


def test_wordle_held_out_games_draw_every_split_from_the_whole_list(tmp_path: Path) -> None:
    few = tmp_path / "words"
    few.write_text("crane\nslate\n")  # too few words for three splits, enough for games
    assert {Wordle(word_list=str(few), held_out="games").word(t) for t in range(50)} == {"crane", "slate"}
    with pytest.raises(ValueError, match=r"too few 5-letter words for all splits"):
        Wordle(word_list=str(few))
    with pytest.raises(ValueError, match=r"has no 6-letter word"):
        Wordle(word_list=str(few), length=6, held_out="games")
    small = "configs/envs/wordle-small.txt"
    words = set(Path(small).read_text().split())
    env = Wordle(word_list=small, held_out="games")
    test_ids = list(Wordle.tasks("test", word_list=small, held_out="games"))
    train_ids = list(Wordle.tasks("train", word_list=small, held_out="games"))
    assert len(test_ids) == 1_000 and len(train_ids) == 100_000
    assert not set(test_ids) & set(train_ids)  # other games ...
    test_words = {env.word(t) for t in test_ids}
    train_words = {env.word(t) for t in train_ids[:2_000]}
    assert test_words == train_words == words  # ... of the same words, every one of the list
    by_words = Wordle(word_list=small)
    assert not {by_words.word(t) for t in Wordle.tasks("test", word_list=small)} & set(load_words(small)["train"])
    assert env.word(test_ids[7]) == Wordle(word_list=small, held_out="games").word(test_ids[7])  # by the id alone
    with pytest.raises(ValueError, match=r"task id .* past the test split \(1000 games"):
        env.word(test_ids[-1] + 1)
    results = solve(env, test_ids[3])
    assert results[-1].info["success"] is True and len(results) <= 6
    with pytest.raises(ValueError, match=r"option held_out must be one of \['words', 'games'\], got 'seeds'"):
        Wordle(word_list=small, held_out="seeds")
    with pytest.raises(ValueError, match=r"option held_out must be one of"):
        Wordle.tasks("test", word_list=small, held_out="seeds")
