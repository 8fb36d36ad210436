"""The ``remote`` env against our real env server (``agentgym.envpool.server``) over loopback:
the AgentGym HTTP API, episodes through the real EnvPool, a crashing env behind the server, a
server that is down or never answers, and bad requests."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import urllib.error
import urllib.request
from typing import Any

import pytest

from agentgym.envpool.envs.remote import DIALECTS, Remote, RemoteEnvError, _text, parse_splits
from agentgym.envpool.pool import EnvFailure, EnvPool
from agentgym.envpool.server import EnvServer, task_ranges


@pytest.fixture(scope="module")
def guess_server() -> Any:
    with EnvServer("guess_number", {"high": 16}, size=2) as server:
        yield server


def http(url: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def play(env: Remote, task_id: int) -> list[tuple[str, str, float, bool]]:
    moves = [("", env.reset(task_id), 0.0, False)]
    for _ in range(8):
        action = env.expert_action()
        r = env.step(action)
        moves.append((action, r.observation, r.reward, r.done))
        if r.done:
            break
    return moves


def test_agentgym_api_on_our_server(guess_server: EnvServer) -> None:
    url = guess_server.url
    assert http(url, "GET", "/") == (200, "This is environment guess_number.")
    status, created = http(url, "POST", "/create", {})
    assert status == 200 and isinstance(created["id"], int)
    env_id = created["id"]
    status, reset = http(url, "POST", "/reset", {"id": env_id, "data_idx": 5})
    assert status == 200 and reset["observation"] == "guess a number from 1 to 16" and reset["done"] is False
    assert "higher, lower or correct" in reset["instructions"]
    status, step = http(url, "POST", "/step", {"id": env_id, "action": "no idea"})
    assert (status, step["observation"], step["reward"], step["done"]) == (
        200,
        "invalid, say a number from 1 to 16",
        0.0,
        False,
    )
    assert http(url, "GET", f"/observation?id={env_id}") == (200, "invalid, say a number from 1 to 16")
    status, expert = http(url, "GET", f"/expert?id={env_id}")
    assert status == 200 and expert["action"].isdigit()
    assert http(url, "POST", "/close", {"id": env_id}) == (200, True)
    status, err = http(url, "POST", "/step", {"id": env_id, "action": "3"})
    assert status == 404 and f"no env with id {env_id}" in err["error"]
    status, tasks = http(url, "GET", "/tasks?split=test")
    assert status == 200 and tasks["ranges"] == [[(1 << 30) + 10_000, (1 << 30) + 20_000]]


def test_bad_requests_get_errors_naming_the_field(guess_server: EnvServer) -> None:
    url = guess_server.url
    env_id = http(url, "POST", "/create", {})[1]["id"]
    cases = [
        ("POST", "/reset", {"id": env_id}, 400, "'data_idx' must be a non-negative integer"),
        ("POST", "/reset", {"id": env_id, "data_idx": -1}, 400, "'data_idx' must be a non-negative integer"),
        ("POST", "/reset", {"id": "x", "data_idx": 1}, 400, "'id' must be a non-negative integer"),
        ("POST", "/step", {"id": env_id, "action": "3"}, 409, "no episode running"),
        ("POST", "/step", {"id": env_id}, 400, "field 'action' must be a string, got None"),
        ("POST", "/reset", {"id": 10**6, "data_idx": 1}, 404, "no env with id 1000000"),
        ("POST", "/reset", b"{not json", 400, "body is not JSON"),
        ("POST", "/reset", [1, 2], 400, "body must be a JSON object"),
        ("GET", "/nowhere", None, 404, "no route GET /nowhere"),
        ("GET", "/tasks?split=validation", None, 400, "unknown split 'validation'"),
    ]
    for method, path, body, status, message in cases:
        got_status, got = http(url, method, path, body)
        assert got_status == status and message in got["error"], (path, body, got_status, got)
    http(url, "POST", "/reset", {"id": env_id, "data_idx": 1})
    status, err = http(url, "POST", "/step", {"id": env_id, "action": 7})
    assert status == 400 and "'action' must be a string" in err["error"]
    http(url, "POST", "/close", {"id": env_id})


def test_remote_env_contract_and_determinism(guess_server: EnvServer) -> None:
    a, b = Remote(url=guess_server.url), Remote(url=guess_server.url + "/")
    try:
        for task_id in (0, 3, 11):
            moves = play(a, task_id)
            assert moves == play(b, task_id)
            assert moves[-1][1:] == ("correct", 1.0, True) and len(moves) - 1 <= 5
        assert a.instructions().startswith("guess a number from 1 to 16")
        assert len({play(a, t)[-1][0] for t in range(8)}) > 2  # the targets differ by task
        a.reset(4)
        r = a.step("twelve")
        assert (r.observation, r.reward, r.done) == ("invalid, say a number from 1 to 16", 0.0, False)
        assert r.info["turns"] == 1
        while not r.done:
            r = a.step(a.expert_action())
        assert r.info["success"] is True
        assert a.step("1") == a.step("2")  # after the end: answered locally, no error
        assert a.step("1").observation == "The episode is over."
    finally:
        a.close()
        b.close()
    assert json.loads(urllib.request.urlopen(guess_server.url + "/health").read())["live_workers"] == 2


def test_remote_env_through_the_pool_plays_concurrently(guess_server: EnvServer) -> None:
    async def main() -> None:
        async with EnvPool("remote", {"url": guess_server.url}, 2) as pool:
            assert pool.task_id("test", 0) == (1 << 30) + 10_000  # from the server's GET /tasks

            async def solve(task_id: int) -> tuple[float, int]:
                async with pool.episode(task_id) as ep:
                    await ep.reset()
                    assert ep.instructions.startswith("guess a number")
                    for turn in range(1, 9):
                        r = await ep.step(await ep.expert_action())
                        if r.done:
                            return r.reward, turn
                raise AssertionError(task_id)

            results = await asyncio.gather(*(solve(t) for t in range(9)))
            assert all(reward == 1.0 and turns <= 5 for reward, turns in results)
            assert pool.stats()["failures"] == {}

    asyncio.run(main())


def test_env_worker_crash_behind_the_server_fails_one_episode() -> None:
    with EnvServer("chaos", {"crash_on_step": 2, "only_task": 1, "episode_len": 3}, size=1) as server:
        env = Remote(url=server.url, timeout_s=30)
        try:
            assert env.reset(1) == "chaos task 1"
            assert env.step("a").observation == "echo a"
            with pytest.raises(RemoteEnvError, match=r"POST /step: HTTP 502: .*task 1: crash"):
                env.step("b")
            # A fresh server-side env on a replacement worker: the next episode plays.
            assert env.reset(2) == "chaos task 2"
            rewards = [env.step(x).reward for x in "abc"]
            assert rewards == [0.0, 0.0, 1.0]
        finally:
            env.close()
        status, health = http(server.url, "GET", "/health")
        assert health["failures"] == {"crash": 1} and health["restarts"] == 1


def test_server_down_or_silent_fails_the_episode_with_a_reason() -> None:
    # A port with nothing behind it, and one that accepts connections but never answers.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead_port = s.getsockname()[1]
    silent = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        silent.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(silent.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()

    async def main() -> None:
        for url, detail in [
            (f"http://127.0.0.1:{dead_port}", r"POST /create: cannot reach the server: .*refused"),
            (f"http://127.0.0.1:{silent.getsockname()[1]}", r"POST /create: no answer within 1 s"),
        ]:
            async with EnvPool("remote", {"url": url, "timeout_s": 1.0}, 1, reset_timeout_s=30) as pool:
                async with pool.episode(7) as ep:
                    with pytest.raises(EnvFailure, match=detail) as err:
                        await ep.reset()
                    assert err.value.reason == "env_error" and err.value.task_id == 7
                assert pool.stats()["failures"] == {"env_error": 1}

    try:
        asyncio.run(main())
    finally:
        stop.set()
        thread.join()
        for c in accepted:
            c.close()
        silent.close()


def test_remote_options_and_dialect_replies() -> None:
    with pytest.raises(ValueError, match="option url must be 'http://host:port'"):
        Remote()
    with pytest.raises(ValueError, match="unknown dialect 'webshopp'"):
        Remote(url="http://127.0.0.1:1", dialect="webshopp")
    with pytest.raises(ValueError, match="option splits: bad part 'train=0-10'"):
        Remote(url="http://127.0.0.1:1", splits="train=0-10")
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['timeout'\]"):
        Remote(url="http://127.0.0.1:1", timeout=3)
    assert parse_splits("train=0:2000, test=2000:2200") == {"train": range(0, 2000), "test": range(2000, 2200)}
    assert Remote.tasks("test", url="http://127.0.0.1:1", splits="train=0:5,test=5:7") == range(5, 7)
    # Replies as AgentGym's servers shape them: WebShop's reset [obs, null], SciWorld's reset with its
    # task description, SearchQA's bare string, WebShop's step "state".
    assert _text(["WebShop [SEP] Instruction", None], "x") == "WebShop [SEP] Instruction"
    assert _text({"observation": "You are in the hallway.", "task_description": "Boil water."}, "x") == (
        "Boil water.\nYou are in the hallway."
    )
    assert _text("Question: who?", "x") == "Question: who?"
    assert _text({"state": "page", "reward": 0, "done": False, "info": None}, "x") == "page"
    with pytest.raises(RemoteEnvError, match="no observation in the answer"):
        _text({"reward": 1}, "server")
    assert DIALECTS["webshop"].id_key == "env_idx" and DIALECTS["agentgym"].reset_key == "data_idx"
    assert task_ranges([1, 2, 3, 7, 8]) == [[1, 4], [7, 9]] and task_ranges(range(4, 9)) == [[4, 9]]


@pytest.mark.parametrize("sigint", ["default", "ignored"])
def test_server_command_serves_until_ctrl_c(sigint: str) -> None:
    """Ctrl-C stops the server. "ignored": started the way a non-interactive shell starts a
    background job, with SIGINT set to SIG_IGN, which Python then leaves alone (the server used to
    ignore Ctrl-C there and hang until killed)."""
    import signal
    import subprocess
    import sys

    def ignore_sigint() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agentgym.envpool.server",
            "guess_number",
            "--kwargs",
            '{"high": 4}',
            "--size",
            "1",
            "--port",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=ignore_sigint if sigint == "ignored" else None,
    )
    try:
        line = ""
        assert proc.stdout is not None
        while not line.startswith("serving guess_number on "):
            line = proc.stdout.readline()
            assert line or proc.poll() is None, "the server exited before serving"
        env = Remote(url=line.split()[-1])
        assert env.reset(2) == "guess a number from 1 to 4"
        assert play(env, 2)[-1][1:] == ("correct", 1.0, True)
        env.close()
        proc.send_signal(signal.SIGINT)
        # A deadline against a hang, not a speed check.
        try:
            out, _ = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            raise AssertionError(
                f"the server did not exit within 120 s of Ctrl-C; its output:\n{out[-3000:]}"
            ) from None
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert "env_pool_closed" in out
