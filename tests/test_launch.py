"""The local launcher's process settings (``agentgym train``'s ``launch`` section)."""

from __future__ import annotations

import os
import time

import pytest

from agentgym.config import Config
from agentgym.cli.launch import _spawn


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
