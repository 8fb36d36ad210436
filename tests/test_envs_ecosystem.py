"""The adapters for other ecosystems' env packages (``reasoning_gym``, ``textarena``,
``skyrl_gym``), against the real packages in real env worker processes: one task of each played
through an ``EnvPool`` (reset, step, reward, termination), and the errors: an unknown id at
start-up, an env that raises mid-episode, a worker that dies, a package that is not installed."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sys
from pathlib import Path

import pytest

from agentgym.envpool.base import StepResult, split_of

# The packages are the envs extra, which scripts/install.sh installs: no skip where they are missing
# (CI must not pass without them); each test then fails with the adapter's error naming the extra.
from agentgym.envpool.envs.reasoning_gym import ReasoningGym
from agentgym.envpool.envs.skyrl_gym import SkyRLGym
from agentgym.envpool.envs.textarena import TextArena, random_move
from agentgym.envpool.pool import EnvFailure, EnvPool, EnvStartError

DATA = Path(__file__).resolve().parents[1] / "configs" / "ecosystem" / "data"
TRAIN, TEST = str(DATA / "skyrl_gsm8k_train.jsonl"), str(DATA / "skyrl_gsm8k_test.jsonl")


def run(coro):  # noqa: ANN001, ANN201
    return asyncio.run(asyncio.wait_for(coro, 120))


# ------------------------------------------------------------------ one task of each, in a pool


def test_reasoning_gym_scores_with_the_dataset_and_gives_a_wrong_answer_another_try() -> None:
    kwargs = {"dataset": "leg_counting", "size": 20, "seed": 3, "test_size": 5, "max_tries": 2, "answer": "raw"}
    oracle = ReasoningGym(**kwargs)
    oracle.reset(7)
    right = oracle.expert_action()

    async def main() -> None:
        async with EnvPool("reasoning_gym", kwargs, 1) as pool:
            async with pool.episode(7) as ep:
                question = await ep.reset()
                assert "legs" in question and "<answer>" not in ep.instructions
                wrong = await ep.step("-1")
                assert (wrong.reward, wrong.done) == (0.0, False)
                assert wrong.observation == "incorrect (score 0.00): try again, 1 try left"
                last = await ep.step(right)
                assert (last.observation, last.reward, last.done, last.info["success"]) == ("correct", 1.0, True, True)
            async with pool.episode(8) as ep:  # two wrong answers: done with the last score
                await ep.reset()
                await ep.step("-1")
                last = await ep.step("-2")
                assert (last.reward, last.done, last.info["success"]) == (0.0, True, False)
            assert pool.task_id("test", 0) == ReasoningGym.tasks("test", **kwargs)[0]
            # forked from a zygote that imported reasoning_gym once (Env.preload), not a new Python each
            assert pool.stats()["starts"] == {"forked": 1}

    run(main())


def test_reasoning_gym_train_and_test_items_come_from_disjoint_seeds() -> None:
    env = ReasoningGym(dataset="leg_counting", size=30, seed=0, test_size=30)
    train = {env.reset(t) for t in ReasoningGym.tasks("train", size=30)}
    test = {env.reset(t) for t in ReasoningGym.tasks("test", size=30, test_size=30)}
    assert len(train) == 30 and len(test) == 30 and not train & test
    assert {split_of(t) for t in ReasoningGym.tasks("test", size=30, test_size=30)} == {"test"}
    # tag format: the reply's last <answer>...</answer> is the answer
    env.reset(0)
    assert env.step(f"I think <answer>0</answer> no: {env.expert_action()}").reward == 1.0
    with pytest.raises(ValueError, match=r"test seeds 10\.\.19 overlap the training seeds 0\.\.29"):
        ReasoningGym(dataset="leg_counting", size=30, seed=0, test_size=10, test_seed=10)


def test_textarena_single_player_game_is_won_with_the_games_reward() -> None:
    async def main() -> None:
        async with EnvPool("textarena", {"game": "GuessTheNumber-v0"}, 1) as pool:
            async with pool.episode(5) as ep:
                first = await ep.reset()
                assert "Guess The Number" in first and "between 1 and 20" in first
                lo, hi = 1, 20  # binary search on the game's own hints
                for _ in range(10):
                    guess = (lo + hi) // 2
                    r = await ep.step(f"[{guess}]")
                    if r.done:
                        break
                    assert r.reward == 0.0
                    if "higher" in r.observation:
                        lo = guess + 1
                    else:
                        assert "lower" in r.observation, r.observation
                        hi = guess - 1
                assert (r.done, r.reward, r.info["success"]) == (True, 1.0, True)

    run(main())


def test_textarena_two_player_game_against_the_random_opponent_ends_with_the_seats_reward() -> None:
    kwargs = {"game": "TicTacToe-v0", "opponent": "random"}

    async def play(task: int) -> tuple[list[str], float, bool]:
        async with EnvPool("textarena", kwargs, 1) as pool:
            async with pool.episode(task) as ep:
                obs = [await ep.reset()]
                for _ in range(9):
                    r = await ep.step(random_move(obs[-1], random.Random(len(obs))))
                    obs.append(r.observation)
                    if r.done:
                        return obs, r.reward, bool(r.info["success"])
        raise AssertionError(obs)

    obs, reward, success = run(play(11))
    assert "Tic Tac Toe" in obs[0] and "Available Moves" in obs[0]
    assert any("[Player 1]" in o for o in obs[1:])  # the opponent's moves reach the agent
    assert reward in (-1.0, 0.0, 1.0) and success == (reward == 1.0)
    assert run(play(11)) == (obs, reward, success)  # a deterministic function of the task and the moves

    full = TextArena(**kwargs, observation="full")  # the whole game every turn, as textarena's LLM agents see it
    first = full.reset(11)
    assert first == obs[0] and full.step("[4]").observation.startswith(first)


class NonsenseAgent:
    """A fixed textarena opponent (``opponent = "module:Class"``) that never makes a valid move."""

    def __call__(self, observation: str) -> str:
        return "pass"


def test_textarena_opponent_that_loses_before_the_agent_moves_pays_the_agent_at_its_first_step() -> None:
    env = TextArena(game="TicTacToe-v0", opponent=f"{__name__}:NonsenseAgent", seat=1)  # player 0 moves first
    assert "Tic Tac Toe" in env.reset(3)
    r = env.step("[4]")  # the game is already over: two invalid moves lost it for player 0
    assert (r.reward, r.done, r.info["success"]) == (1.0, True, True)
    assert "does not follow the correct format" in r.observation
    assert env.step("[4]") == StepResult("the game is over", 0.0, True, {"success": False})


def test_textarena_opponent_from_a_local_checkpoint_is_textarenas_own_agent_and_greedy(fallback_model: Path) -> None:
    env = TextArena(game="TicTacToe-v0", opponent=f"hf:{fallback_model}", seat=1)
    assert type(env.opponent).__name__ == "HFLocalAgent"
    first = env.reset(4)
    assert "[Player 0]" in first  # the checkpoint moved first (whatever a random tiny model says)
    assert env.reset(4) == first  # greedy: the same game again


def test_skyrl_gym_env_steps_on_a_row_and_pays_its_reward() -> None:
    kwargs = {"env_id": "gsm8k_multi_turn", "data": TRAIN, "test_data": TEST}
    answer = json.loads(Path(TEST).read_text().splitlines()[0])["reward_spec"]["ground_truth"]

    async def main() -> None:
        async with EnvPool("skyrl_gym", kwargs, 1) as pool:
            async with pool.episode(pool.task_id("test", 0)) as ep:
                prompt = await ep.reset()
                assert "How many" in prompt and "####" in prompt
                r = await ep.step("no idea")
                assert not r.done and "#### ANSWER" in r.observation
                r = await ep.step(f"so #### {answer}")
                assert (r.reward, r.done, r.info["success"]) == (1.0, True, True)

    run(main())
    assert len(SkyRLGym.tasks("train", **kwargs)) == 32 and len(SkyRLGym.tasks("test", **kwargs)) == 8


# ------------------------------------------------------------------ errors: one line, nothing lost


@pytest.mark.parametrize(
    ("env", "kwargs", "match"),
    [
        (
            "reasoning_gym",
            {"dataset": "leg_countin"},
            r"unknown dataset 'leg_countin' \(did you mean leg_counting.*the 10\d datasets: ab, acre",
        ),
        (
            "reasoning_gym",
            {"dataset": "leg_counting", "min_animal": 2},
            r"has no option\(s\) \['min_animal'\]; its options: max_animals",
        ),
        (
            "textarena",
            {"game": "TicTacToe-v9"},
            r"unknown game 'TicTacToe-v9' \(did you mean TicTacToe-v0.*the \d+ games: 2048-v0",
        ),
        ("textarena", {"game": "TicTacToe-v0"}, r"TicTacToe-v0 is a 2-player game: set option opponent"),
        (
            "skyrl_gym",
            {"env_id": "gsm8", "data": TRAIN},
            r"unknown env id 'gsm8' \(did you mean gsm8k\?\); the \d env ids: aime, gsm8k",
        ),
    ],
)
def test_an_unknown_id_fails_the_pool_start_in_one_line_listing_what_exists(env: str, kwargs: dict, match: str) -> None:
    async def main() -> None:
        pool = EnvPool(env, kwargs, 1)
        with pytest.raises(EnvStartError, match=match) as info:
            await pool.start()
        assert "\n" not in str(info.value)
        assert pool.stats()["live_workers"] == 0

    run(main())


def test_an_env_raising_mid_episode_fails_that_episode_only(tmp_path: Path) -> None:
    # A real skyrl-gym env on a malformed row: AIME's scorer calls .split on its ground truth.
    rows = tmp_path / "aime.jsonl"
    rows.write_text(
        "".join(
            json.dumps({"prompt": f"2 + {n} = ?", "reward_model": {"ground_truth": gt}}) + "\n"
            for n, gt in enumerate([7, "3"])
        )
    )

    async def main() -> None:
        async with EnvPool("skyrl_gym", {"env_id": "aime", "data": str(rows)}, 1) as pool:
            async with pool.episode(0) as ep:
                pid = ep.worker_pid
                await ep.reset()
                with pytest.raises(
                    EnvFailure, match=r"task 0: env_error: AttributeError: 'int' object has no attribute 'split'"
                ) as info:
                    await ep.step("Answer: 2")
                assert info.value.reason == "env_error" and "\n" not in str(info.value)
            async with pool.episode(1) as ep:  # the worker is kept, as for the built-in envs
                assert ep.worker_pid == pid
                await ep.reset()
                r = await ep.step("Answer: 3")
                assert (r.reward, r.done) == (1.0, True)
            stats = pool.stats()
            assert stats["failures"] == {"env_error": 1} and stats["restarts"] == 0

    run(main())


def test_a_worker_that_dies_mid_game_fails_its_episode_and_is_replaced() -> None:
    async def main() -> None:
        async with EnvPool("textarena", {"game": "TicTacToe-v0", "opponent": "random"}, 1) as pool:
            async with pool.episode(3) as ep:
                await ep.reset()
                os.kill(ep.worker_pid, signal.SIGKILL)
                with pytest.raises(EnvFailure) as info:
                    await ep.step("[4]")
                assert info.value.reason == "crash" and "\n" not in str(info.value)
            async with pool.episode(3) as ep:
                assert "Tic Tac Toe" in await ep.reset()
                assert not (await ep.step("[4]")).done
            assert pool.stats()["restarts"] == 1 and pool.stats()["failures"] == {"crash": 1}

    run(main())


@pytest.mark.parametrize(
    ("cls", "kwargs", "module", "extra"),
    [
        (ReasoningGym, {"dataset": "leg_counting"}, "reasoning_gym", "reasoning-gym"),
        (TextArena, {"game": "GuessTheNumber-v0"}, "textarena", "textarena"),
        (SkyRLGym, {"env_id": "gsm8k", "data": TRAIN}, "skyrl_gym", "skyrl-gym"),
    ],
)
def test_a_missing_package_names_the_extra_to_install(cls, kwargs, module, extra, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setitem(sys.modules, module, None)  # what `import` sees where the package is not installed
    with pytest.raises(
        ImportError, match=rf"needs the package of the '{extra}' extra: pip install 'agentgym\[{extra}\]'"
    ) as info:
        cls(**kwargs)
    assert "\n" not in str(info.value)


def test_agentgym_train_stops_on_an_unknown_dataset_before_any_process_starts(tmp_path: Path) -> None:
    import subprocess

    config = Path(__file__).resolve().parents[1] / "configs" / "ecosystem" / "reasoning_gym.toml"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "agentgym.cli",
            "train",
            "--config",
            str(config),
            "-o",
            'env.kwargs.dataset="leg_countin"',
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2
    assert out.stderr.startswith(
        "error: env.kwargs: env reasoning_gym: unknown dataset 'leg_countin' (did you mean leg_counting"
    )
    assert out.stderr.count("\n") == 1 and not list(tmp_path.iterdir())  # one line; no run directory, no model made
