"""EnvPool with real worker subprocesses: the episode contract, determinism, and surviving envs
that crash, hang, raise or corrupt their pipe. Each test runs its own event loop (asyncio.run or
uvloop), no pytest plugin."""

from __future__ import annotations

import asyncio
import math
import os
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import structlog
import uvloop
from envpool_fixtures import expert_episode

from agentgym.envpool.pool import EnvFailure, EnvPool, EnvStartError
from agentgym.envpool.registry import UnknownEnvError
from agentgym.protocol.envworker import (
    ENVWORKER_VERSION,
    Failure,
    Observation,
    Open,
    Ready,
    Reset,
    Step,
    body_length,
    decode_reply,
    pack_frame,
)

GUESS = "agentgym.envpool.envs.guess_number:GuessNumber"
CHAOS = "agentgym.envpool.envs.chaos:Chaos"


def run(main: Callable[[], Awaitable[Any]], *, use_uvloop: bool = False) -> Any:
    if use_uvloop:
        return uvloop.run(main())
    return asyncio.run(main())


# ---------------------------------------------------------------- contract and determinism


def test_episode_contract_through_the_pool() -> None:
    async def main() -> None:
        async with EnvPool("guess_number", {"low": 1, "high": 8}, 2) as pool:
            async with pool.episode(3) as ep:
                assert ep.instructions == ""
                assert await ep.reset() == "guess a number from 1 to 8"
                assert "higher, lower or correct" in ep.instructions
                r = await ep.step("no idea")
                assert (r.observation, r.reward, r.done, r.info) == (
                    "invalid, say a number from 1 to 8",
                    0.0,
                    False,
                    {"turns": 1, "valid": False},
                )
                with pytest.raises(RuntimeError, match="reset called twice"):
                    await ep.reset()
                assert ep.turns == 1
            async with pool.episode(4) as ep:
                with pytest.raises(RuntimeError, match="Step before reset"):
                    await ep.step("4")
            first, moves, reward = await expert_episode(pool, 5, 10)
            assert reward == 1.0 and moves[-1][1] == "correct"
            assert len(moves) <= math.ceil(math.log2(8)) + 1
            stats = pool.stats()
            assert stats["episodes"] == 2 and stats["steps"] == 1 + len(moves)
            assert stats["failures"] == {} and stats["restarts"] == 0 and stats["live_workers"] == 2
        assert pool.stats()["live_workers"] == 0
        with pytest.raises(RuntimeError, match="closed"):
            async with pool.episode(1):
                pass

    run(main)


def test_misuse_of_an_episode_is_refused_without_losing_the_worker() -> None:
    async def main() -> None:
        async with EnvPool("guess_number", {}, 1) as pool:
            async with pool.episode(1) as ep:
                await ep.reset()
                pid = ep.worker_pid
                with pytest.raises(EnvFailure, match=r"protocol: Step: body of \d+ bytes exceeds"):
                    await ep.step("4" * (9 * 1024 * 1024))
            async with pool.episode(2) as ep:
                await ep.reset()
                assert ep.worker_pid == pid  # refused before sending: the worker stayed in step
                with pytest.raises(RuntimeError, match="in flight"):
                    await asyncio.gather(ep.step("1"), ep.step("2"))
            with pytest.raises(RuntimeError, match="after its `async with` ended"):
                await ep.step("3")
            _, _, reward = await expert_episode(pool, 3, 10)  # the pool still plays
            assert reward == 1.0

    run(main)


def test_same_task_ids_play_the_same_across_pools() -> None:
    async def transcripts(size: int) -> list[Any]:
        async with EnvPool("guess_number", {"high": 16}, size) as pool:
            return [await expert_episode(pool, t, 10) for t in range(12)]

    async def main() -> None:
        a, b = await transcripts(1), await transcripts(3)
        assert a == b
        assert len({moves[-1][0] for _, moves, _ in a}) > 3  # different targets

    run(main)


def test_expert_solves_a_sample_of_tasks_concurrently() -> None:
    async def main() -> None:
        async with EnvPool("guess_number", {"low": 1, "high": 20}, 4) as pool:
            results = await asyncio.gather(*(expert_episode(pool, t, 10) for t in range(16)))
            bound = math.ceil(math.log2(20)) + 1
            assert all(reward == 1.0 and len(moves) <= bound for _, moves, reward in results)
            assert pool.stats()["episodes"] == 16 and pool.stats()["restarts"] == 0

    run(main, use_uvloop=True)


def test_unknown_env_and_bad_options_fail_up_front() -> None:
    with pytest.raises(UnknownEnvError, match=r"'guess_nmber'.*known environments: .*guess_number"):
        EnvPool("guess_nmber", {}, 4)  # raises in the constructor: no process can have started
    with pytest.raises(ValueError, match="size must be >= 1, got 0"):
        EnvPool("guess_number", {}, 0)

    async def main() -> None:
        pool = EnvPool("guess_number", {"hihg": 9}, 2)
        with pytest.raises(EnvStartError, match=r"2 of 2 workers failed.*unknown option\(s\) \['hihg'\]"):
            await pool.start()
        assert pool.stats()["live_workers"] == 0

    run(main)


# ---------------------------------------------------------------- failures cost one episode


@pytest.mark.parametrize(
    ("options", "reason", "detail"),
    [
        ({"crash_on_step": 2}, "crash", "exited with code 3 during Step"),
        ({"crash_on_step": 0}, "crash", "exited with code 3 during Reset"),
        ({"hang_on_step": 1}, "timeout", "no reply to Step within 0.5 s; killed"),
        ({"hang_on_step": 0}, "timeout", "no reply to Reset within 0.5 s; killed"),
        ({"raise_on_step": 2}, "env_error", "RuntimeError: chaos raise_on_step=2 task=1"),
        ({"garbage_on_step": 1}, "protocol", "announces 4294967295 bytes"),
        # An observation over the pipe's 8 MiB frame cap: refused by the worker, which lives on.
        ({"huge_on_step": 1, "huge_chars": 9_000_000}, "env_error", "exceeds the 8388608-byte env frame limit"),
        ({"garbage_on_step": 1, "garbage": "body"}, "protocol", "reply is not valid msgpack"),
    ],
)
def test_a_failing_env_costs_one_episode(options: dict[str, Any], reason: str, detail: str) -> None:
    async def main() -> None:
        kwargs = {**options, "only_task": 1}
        async with EnvPool("chaos", kwargs, 1, step_timeout_s=0.5, reset_timeout_s=0.5, start_timeout_s=60) as pool:
            async with pool.episode(1) as ep:
                first_pid = ep.worker_pid
                with pytest.raises(EnvFailure) as err:
                    await ep.reset()
                    for i in range(3):
                        await ep.step(f"a{i}")
                assert (err.value.reason, err.value.env, err.value.task_id) == (reason, "chaos", 1)
                assert detail in str(err.value), str(err.value)
                with pytest.raises(EnvFailure, match="episode already failed"):  # no silent reuse
                    await ep.step("again")
            # The next episode on the same (one-worker) pool works.
            async with pool.episode(2) as ep:
                assert await ep.reset() == "chaos task 2"
                results = [await ep.step(a) for a in "xyz"]
                assert results[-1].done and results[-1].info["success"] is True
                kept = ep.worker_pid == first_pid
            stats = pool.stats()
            assert stats["failures"] == {reason: 1} and stats["episodes"] == 2
            # Only an env exception leaves the worker in service; the rest are replaced.
            assert kept == (reason == "env_error")
            assert stats["restarts"] == (0 if reason == "env_error" else 1)

    run(main)


def test_worker_killed_while_idle_is_replaced() -> None:
    async def main() -> None:
        async with EnvPool("guess_number", {}, 1) as pool:
            async with pool.episode(1) as ep:
                await ep.reset()
                pid = ep.worker_pid
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            while os.path.exists(f"/proc/{pid}"):  # until asyncio's child watcher has reaped it
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)
            _, moves, reward = await expert_episode(pool, 2, 10)
            assert reward == 1.0
            assert pool.stats()["restarts"] == 1 and pool.stats()["failures"] == {}

    run(main)


def test_cancelled_step_kills_the_worker_and_the_pool_goes_on() -> None:
    async def main() -> None:
        async with EnvPool("chaos", {"hang_on_step": 1, "only_task": 1}, 1, step_timeout_s=60) as pool:

            async def stuck() -> None:
                async with pool.episode(1) as ep:
                    await ep.reset()
                    await ep.step("x")  # hangs until cancelled

            task = asyncio.create_task(stuck())
            await asyncio.sleep(0.5)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            async with pool.episode(2) as ep:
                await ep.reset()
                assert (await ep.step("y")).observation == "echo y"
            assert pool.stats()["restarts"] == 1

    run(main)


def test_workers_are_recycled_after_n_episodes() -> None:
    async def main() -> None:
        pids = []
        async with EnvPool("guess_number", {}, 1, recycle_after=2) as pool:
            for t in range(5):
                async with pool.episode(t) as ep:
                    await ep.reset()
                    pids.append(ep.worker_pid)
            stats = pool.stats()
        assert pids[0] == pids[1] != pids[2] == pids[3] != pids[4]
        assert stats["recycled"] == 2 and stats["restarts"] == 2 and stats["failures"] == {}

    run(main)


def test_episodes_wait_fifo_and_close_wakes_waiters() -> None:
    async def main() -> None:
        order: list[int] = []
        pool = EnvPool("guess_number", {}, 1)
        await pool.start()

        async def play(t: int) -> None:
            async with pool.episode(t) as ep:
                order.append(t)
                await ep.reset()
                await asyncio.sleep(0.01)

        await asyncio.gather(*(play(t) for t in range(6)))
        assert order == list(range(6))

        async with pool.episode(0):
            waiter = asyncio.create_task(play(99))
            await asyncio.sleep(0.05)
            await pool.close()
        with pytest.raises(RuntimeError, match="closed while waiting"):
            await waiter
        assert pool.stats()["live_workers"] == 0

    run(main)


def test_worker_output_goes_to_the_log_not_the_frames() -> None:
    async def main() -> list[dict[str, Any]]:
        with structlog.testing.capture_logs() as logs:
            async with EnvPool("chaos", {}, 1) as pool:
                async with pool.episode(7) as ep:
                    await ep.reset()
                    assert (await ep.step("hi")).observation == "echo hi"
        return logs

    logs = run(main)
    lines = [e["line"] for e in logs if e["event"] == "env_worker_output"]
    assert "chaos stray print task=7 step=0" in lines and "chaos stray print task=7 step=1" in lines


# ---------------------------------------------------------------- the worker process on its own


def _worker(*requests: bytes) -> tuple[list[Any], int, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "agentgym.envpool.worker"],
        input=b"".join(requests),
        capture_output=True,
        timeout=30,
        check=False,
    )
    out, replies = proc.stdout, []
    while out:
        n = body_length(out[:4])
        replies.append(decode_reply(out[4 : 4 + n]))
        out = out[4 + n :]
    return replies, proc.returncode, proc.stderr.decode()


def test_worker_speaks_frames_and_keeps_prints_off_stdout() -> None:
    replies, code, err = _worker(
        pack_frame(Step(action="early")),
        pack_frame(Open(version=ENVWORKER_VERSION, env="chaos", target=CHAOS, kwargs={"episode_len": 1})),
        pack_frame(Step(action="before reset")),
        pack_frame(Reset(task_id=4)),
        pack_frame(Step(action="go")),
    )  # stdin closes after these: the worker exits cleanly
    assert code == 0
    assert isinstance(replies[0], Failure) and replies[0].kind == "state" and "before Open" in replies[0].message
    assert isinstance(replies[1], Ready) and replies[1].version == ENVWORKER_VERSION
    assert isinstance(replies[2], Failure) and replies[2].kind == "state" and "before Reset" in replies[2].message
    assert replies[3] == Observation(text="chaos task 4", instructions="say anything")
    assert replies[4] == Observation(text="echo go", reward=1.0, done=True, info={"steps": 1, "success": True})
    assert "chaos stray print task=4 step=1" in err


def test_worker_refuses_a_malformed_request_and_exits() -> None:
    open_ = pack_frame(Open(version=ENVWORKER_VERSION, env="guess_number", target=GUESS))
    replies, code, _ = _worker(open_, b"\x03\x00\x00\x00\xc1\xc1\xc1", pack_frame(Reset(task_id=1)))
    assert isinstance(replies[0], Ready)
    assert isinstance(replies[1], Failure) and replies[1].kind == "protocol"
    assert "not valid msgpack" in replies[1].message
    assert len(replies) == 2 and code == 2  # the Reset after garbage is not served

    replies, code, _ = _worker(b"\x00\x00\x00\x7f")
    assert replies[0].kind == "protocol" and "2130706432 bytes" in replies[0].message and code == 2

    replies, _, _ = _worker(pack_frame(Open(version=ENVWORKER_VERSION + 1, env="x", target=GUESS)))
    assert replies[0].kind == "protocol" and "speaks version" in replies[0].message


def test_evaluation_task_ids_come_from_the_envs_split() -> None:
    from agentgym.envpool.envs.guess_number import GuessNumber

    pool = EnvPool("guess_number", {"low": 1, "high": 8}, size=1)  # no worker needed for the lookup
    test_ids = GuessNumber.tasks("test", low=1, high=8)
    assert [pool.task_id("test", i) for i in range(3)] == [test_ids[0], test_ids[1], test_ids[2]]
    assert pool.task_id("test", len(test_ids)) == test_ids[0]  # wraps around
    assert not set(map(int, GuessNumber.tasks("train")[:1000])) & {pool.task_id("test", i) for i in range(100)}
    with pytest.raises(ValueError, match="unknown split 'valid'"):
        pool.task_id("valid", 0)


# ---------------------------------------------------------------- workers forked by the zygote


def test_workers_are_forked_by_the_zygote_and_die_with_it() -> None:
    async def main() -> None:
        async with EnvPool("guess_number", {}, 2) as pool:
            assert pool.stats()["starts"] == {"forked": 2}
            async with pool.episode(1) as ep:
                await ep.reset()
                zygote = pool._zygote
                assert zygote is not None and ep.worker_pid is not None
                with open(f"/proc/{ep.worker_pid}/stat") as f:  # its parent is the zygote, not us
                    assert int(f.read().rsplit(")", 1)[1].split()[1]) == zygote.pid
                os.kill(zygote.pid, signal.SIGKILL)
                with pytest.raises(EnvFailure, match="crash"):
                    for _ in range(50):  # the worker dies with the zygote (PR_SET_PDEATHSIG)
                        await ep.step("4")
                        await asyncio.sleep(0.05)
            # The pool goes on without it: new workers are started as new processes.
            _, _, reward = await expert_episode(pool, 2, 10)
            _, _, reward2 = await expert_episode(pool, 3, 10)
            assert reward == reward2 == 1.0
            assert pool.stats()["starts"].get("exec", 0) >= 1

    run(main, use_uvloop=True)


def test_a_forked_worker_plays_as_a_started_one_and_costs_less_cpu_to_start() -> None:
    import resource

    async def main(fork: bool) -> tuple[list, float]:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        async with EnvPool("guess_number", {"high": 16}, 8, fork=fork) as pool:
            played = [await expert_episode(pool, t, 10) for t in range(4)]
            assert pool.stats()["starts"] == {"forked" if fork else "exec": 8}
        after = resource.getrusage(resource.RUSAGE_CHILDREN)  # every process reaped, the zygote's children too
        return played, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)

    forked, forked_cpu = run(lambda: main(True))
    started, started_cpu = run(lambda: main(False))
    assert forked == started  # same moves, same rewards
    # 8 workers: one Python start (the zygote) and 8 forks against 8 Python starts. Counted in CPU
    # seconds of the processes themselves, a ratio inside one test, not a wall time.
    assert forked_cpu < started_cpu / 2, (forked_cpu, started_cpu)


def test_an_env_that_starts_threads_at_import_is_not_forked(tmp_path, monkeypatch) -> None:
    (tmp_path / "threaded_env.py").write_text(
        "import threading, time\n"
        "from agentgym.envpool.envs.guess_number import GuessNumber\n"
        "threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()  # a thread would not survive a fork\n"
        "class Threaded(GuessNumber):\n    pass\n"
    )
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")

    async def main() -> None:
        with structlog.testing.capture_logs() as logs:
            async with EnvPool("threaded_env:Threaded", {}, 2) as pool:
                _, _, reward = await expert_episode(pool, 1, 10)
                assert reward == 1.0 and pool.stats()["starts"] == {"exec": 2}
        refused = [e for e in logs if e["event"] == "env_zygote_unavailable"]
        assert refused and "threads" in refused[0]["error"], logs

    run(main)


def test_a_forked_worker_names_itself_a_worker() -> None:
    import psutil

    async def main() -> None:
        async with EnvPool("guess_number", {}, 1) as pool:
            async with pool.episode(1) as ep:
                await ep.reset()
                cmdline = " ".join(psutil.Process(ep.worker_pid).cmdline())
                assert "agentgym.envpool.worker env=guess_number" in cmdline, cmdline

    run(main)
