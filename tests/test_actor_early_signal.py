"""SIGTERM to an actor before it is registered (Slurm's ``scancel`` of a step still starting):
a real ``agentgym-actor`` process, a learner address where nothing answers.

  - while it loads torch and its config (its SIGTERM handler is the held one of
    agentgym/host/early_signals.py, its event loop not yet running);
  - while it waits for the learner;

either way it stops at once with exit code 0, and writes its record (``actors/ID.json``) with
the reason "got SIGTERM", as an actor stopped after it joined does.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentgym.host.netutil import free_port_pair

REPO = Path(__file__).resolve().parents[1]


def catches_sigterm(pid: int) -> bool:
    """The process has a handler of its own for SIGTERM (/proc's SigCgt mask, bit 15 - 1)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    return False


@pytest.mark.timeout(180)
@pytest.mark.parametrize("when", ["loading", "waiting_for_learner"])
def test_an_actor_sigtermed_before_it_registered_stops_cleanly_with_its_record(tmp_path: Path, when: str) -> None:
    log = tmp_path / "actor.out"
    with log.open("w") as out:
        p = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agentgym.actors.main",
                "--config",
                str(REPO / "configs" / "quickstart.toml"),
                "--learner",
                f"tcp://127.0.0.1:{free_port_pair()}",
                "--connect-timeout",
                "120",
                "--run-dir",
                str(tmp_path),
                "--actor-id",
                "early",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and p.poll() is None:
            ready = catches_sigterm(p.pid) if when == "loading" else "waiting_for_learner" in log.read_text()
            if ready:
                break
            time.sleep(0.01 if when == "loading" else 0.2)
        assert p.poll() is None, log.read_text()
        if when == "loading":  # it has not got as far as asking for the learner
            assert "waiting_for_learner" not in log.read_text(), log.read_text()
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=60) == 0, log.read_text()
    finally:
        p.kill()
    record = json.loads((tmp_path / "actors" / "early.json").read_text())
    assert record["reason"] == "got SIGTERM" and record["groups_sent"] == 0, record
    assert "actor_leaving" in log.read_text() and "registered=False" in log.read_text(), log.read_text()
