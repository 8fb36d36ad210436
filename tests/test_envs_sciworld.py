"""``sciworld`` on the real ScienceWorld simulator (a JVM per env): splits and numbering against the
package, the episode contract, determinism, gold paths, the bounded heap, a missing Java, and a
worker killed mid-episode in the real EnvPool (its JVM goes with it). JVMs are slow to start: one
env in-process for most tests, one pool."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from agentgym.envpool.envs.sciworld import (
    SPLITS,
    JavaNotFound,
    SciWorld,
    describe,
    parse_action,
    read_splits_from_jvm,
)
from agentgym.envpool.envs.sciworld import task_id_of as task_id
from agentgym.envpool.pool import EnvFailure, EnvPool, EnvStartError

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def env() -> Any:
    e = SciWorld()
    yield e
    e.close()


def test_splits_are_the_packages_and_ids_are_numbered_by_split(env: SciWorld) -> None:
    names = ["boil", "find-animal", "inclined-plane-friction-named-surfaces"]
    assert read_splits_from_jvm(names, server=env._server) == {n: SPLITS[n] for n in names}
    train, dev, test = (SciWorld.tasks(s) for s in ("train", "dev", "test"))
    assert (train.start, train.stop, dev.stop, test.stop) == (0, dev.start, test.start, 7207)
    assert len(SPLITS) == 30 and sum(n for _, _, n in SPLITS.values()) == 7207
    assert env.describe(0) == ("boil", 0) and env.describe(7206) == ("mendelian-genetics-unknown-plant", 479)
    assert env.describe(train.stop - 1)[1] == SPLITS["mendelian-genetics-unknown-plant"][0] - 1
    assert env.describe(dev.start) == ("boil", 14)  # the first dev variation of the first task
    only = SciWorld.tasks("train", task_names="melt,boil")
    assert only == range(0, 28) and describe(14, "melt,boil") == ("melt", 0)  # package order: boil first
    for name, variation in [("boil", 0), ("melt", 29), ("use-thermometer", 300), ("find-plant", 160)]:
        assert describe(task_id(name, variation)) == (name, variation)
    with pytest.raises(ValueError, match=r"unknown task name\(s\) \['boill'\]"):
        SciWorld.tasks("train", task_names="boill")
    with pytest.raises(ValueError, match="task id 7207 out of range: the selected tasks have ids 0..7206"):
        env.reset(7207)


def test_contract_invalid_actions_and_determinism(env: SciWorld) -> None:
    tid = task_id("find-animal", 3)
    first = env.reset(tid)
    assert "is called the" in first.split(".")[0]
    assert "Your task is to find a(n) animal" in env.instructions() and "focus on OBJ" in env.instructions()
    moves = [
        env.step(a)
        for a in ("dance with the moon", "", "look around", "Thought: the door.\nAction: open door to kitchen")
    ]
    assert moves[0].observation == "No known action matches that input." and moves[0].reward == 0.0
    assert not any(m.done for m in moves) and moves[1].observation == "No known action matches that input."
    assert moves[2].observation == first
    assert moves[3].observation == "The door is now open."  # the command after "Action:"
    again = env.reset(tid)
    assert again == first
    assert [env.step(a).observation for a in ("dance with the moon", "", "look around")] == [
        m.observation for m in moves[:3]
    ]
    assert env.reset(task_id("find-animal", 4)) != first or env.instructions() != ""


def test_gold_paths_solve_with_the_score_as_reward(env: SciWorld) -> None:
    # The second one asks the expert only after two moves of its own: the gold path is generated
    # then, on a fresh load of the variation with the moves replayed.
    for name, variation, own in [("find-animal", 200, []), ("use-thermometer", 10, ["inventory", "look around"])]:
        env.reset(task_id(name, variation))
        rewards = [env.step(a).reward for a in own]
        r = None
        for _ in range(100):
            r = env.step(env.expert_action())
            rewards.append(r.reward)
            if r.done:
                break
        assert r is not None and r.done and r.info["success"] is True and r.info["score"] == 100, (name, r)
        assert abs(sum(rewards) - 1.0) < 1e-9 and all(0 <= x <= 1 for x in rewards) and max(rewards) > 0
        after = env.step("look around")
        assert (after.reward, after.done) == (0.0, True)


def test_a_failed_task_ends_with_score_zero(env: SciWorld) -> None:
    env.reset(task_id("boil", 0))
    r = env.step("focus on agent")  # focusing on the wrong thing fails a ScienceWorld task
    assert (r.reward, r.done, r.info["success"], r.info["failed"], r.info["score"]) == (0.0, True, False, True, 0)


def test_jvm_heap_is_bounded(env: SciWorld) -> None:
    runtime = env._env._gateway.jvm.java.lang.Runtime.getRuntime()
    assert runtime.maxMemory() <= 384 * 1024 * 1024
    java = psutil.Process(env._env._gateway.java_process.pid)
    assert "-Xmx384m" in java.environ().get("JAVA_TOOL_OPTIONS", "")
    assert "JAVA_TOOL_OPTIONS" not in os.environ  # set for the launch only


def test_missing_java_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(JavaNotFound, match="no `java` is on PATH; install the Debian package openjdk-17-jre-headless"):
        SciWorld()

    async def main() -> None:
        with pytest.raises(EnvStartError, match="JavaNotFound: sciworld: .*openjdk-17-jre-headless"):
            await EnvPool("sciworld", {}, 1).start()

    asyncio.run(main())


def test_parse_action() -> None:
    assert parse_action("open door to kitchen") == "open door to kitchen"
    assert parse_action("Thought: hmm\nAction: go to kitchen\nmore") == "go to kitchen"
    assert parse_action("action:  `focus on water`") == "focus on water"
    assert parse_action("\n\n") == ""


def test_pool_episode_and_a_killed_worker_takes_its_jvm_along() -> None:
    tid = task_id("find-animal", 7, "find-animal")

    async def main() -> None:
        async with EnvPool("sciworld", {"task_names": "find-animal"}, 1, reset_timeout_s=120) as pool:
            async with pool.episode(tid) as ep:
                await ep.reset()
                total, r = 0.0, None
                for _ in range(60):
                    r = await ep.step(await ep.expert_action())
                    total += r.reward
                    if r.done:
                        break
                assert r is not None and r.info["success"] is True and abs(total - 1.0) < 1e-9
            async with pool.episode(tid) as ep:
                await ep.reset()
                worker = psutil.Process(ep.worker_pid)
                jvms = [p for p in worker.children(recursive=True) if "java" in p.name()]
                assert len(jvms) == 1
                os.kill(worker.pid, signal.SIGKILL)
                with pytest.raises(EnvFailure) as err:
                    await ep.step("look around")
                assert err.value.reason == "crash"
            deadline = time.monotonic() + 30
            while jvms[0].is_running() and jvms[0].status() != psutil.STATUS_ZOMBIE:
                assert time.monotonic() < deadline, "the JVM outlived its worker"
                await asyncio.sleep(0.2)
            async with pool.episode(tid) as ep:  # a replacement worker with a new JVM
                assert "is called the" in await ep.reset()
                assert "is called the" in (await ep.step("look around")).observation
            assert pool.stats()["failures"] == {"crash": 1}

    asyncio.run(main())
