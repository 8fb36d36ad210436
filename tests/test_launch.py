"""The local launcher's process settings (``agentgym train``'s ``launch`` section)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentgym.cli.launch import BIND, _spawn, actor_cores, actor_env
from agentgym.config import Config


@pytest.mark.parametrize("nice", [0, 7])
def test_spawned_process_gets_the_niceness_it_was_given(tmp_path, nice):
    # a real child that stays up until killed: a module server bound to a free loopback port
    base = os.getpriority(os.PRIO_PROCESS, 0)
    p = _spawn("http.server", ["0", "--bind", "127.0.0.1"], tmp_path / "console.log", nice=nice)
    try:
        time.sleep(0.2)
        assert p.poll() is None, (tmp_path / "console.log").read_text()
        assert os.getpriority(os.PRIO_PROCESS, p.pid) == min(19, base + nice)
    finally:
        p.kill()
        p.wait()


def test_actor_nice_is_bounded():
    assert Config.model_validate({"launch": {"actor_nice": 19}}).launch.actor_nice == 19
    with pytest.raises(ValueError, match="actor_nice"):
        Config.model_validate({"launch": {"actor_nice": 20}})


def test_spawned_process_gets_the_environment_it_was_given(tmp_path):
    p = _spawn("http.server", ["0", "--bind", "127.0.0.1"], tmp_path / "console.log", env={BIND: "1"})
    try:
        time.sleep(0.2)
        assert p.poll() is None, (tmp_path / "console.log").read_text()
        environ = dict(kv.split("=", 1) for kv in Path(f"/proc/{p.pid}/environ").read_text().split("\0") if "=" in kv)
        assert environ[BIND] == "1" and environ["PATH"] == os.environ["PATH"]
    finally:
        p.kill()
        p.wait()


def test_actor_cores_gives_each_actor_a_share_of_its_own():
    assert actor_cores(2, [0, 1]) == ["0", "1"]
    assert actor_cores(3, list(range(8))) == ["0,1,2", "3,4,5", "6,7"]  # the first ones a core larger
    assert actor_cores(1, [2, 3, 5]) == ["2,3,5"]
    assert actor_cores(4, [0, 1]) == ["0", "1", "0", "1"]  # more actors than cores: round robin
    shares = actor_cores(5, list(range(16)))
    flat = [int(c) for share in shares for c in share.split(",")]
    assert sorted(flat) == list(range(16)) and len(set(flat)) == 16  # every core once, none shared
    with pytest.raises(ValueError, match="no cores"):
        actor_cores(2, [])


def test_hf_actors_take_their_share_of_the_cores_as_threads(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    # Two actors and the learner on 2 cores: one thread each; on 16 cores: 5 each.
    assert actor_env("hf", 2, None, cores=2) == {"OMP_NUM_THREADS": "1"}
    assert actor_env("hf", 2, None, cores=16) == {"OMP_NUM_THREADS": "5"}
    # vLLM sets its worker's threads from its own core set; a bind is passed on as it is.
    assert actor_env("vllm", 2, "0,1", cores=16) == {BIND: "0,1"}
    assert actor_env("vllm", 2, None, cores=16) == {}
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's setting is kept (the child inherits it)
    assert actor_env("hf", 2, None, cores=16) == {}


def test_an_hf_actor_process_runs_torch_with_its_thread_share(tmp_path, monkeypatch):
    # What the launcher adds reaches torch in the child: 8 cores // (3 actors + the learner) = 2.
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    out = tmp_path / "threads.txt"
    code = f"import torch; open({str(out)!r}, 'w').write(str(torch.get_num_threads()))"
    env = {**os.environ, **actor_env("hf", 3, None, cores=8)}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)
    assert out.read_text() == "2"


def test_actor_cores_setting_is_checked():
    assert Config().launch.actor_cores == "engine"
    assert Config.model_validate({"launch": {"actor_cores": "split"}}).launch.actor_cores == "split"
    with pytest.raises(ValueError, match="actor_cores"):
        Config.model_validate({"launch": {"actor_cores": "spread"}})
