"""`kill -USR1 PID` on any agentgym process prints every thread's Python stack to its stderr and
lets it run on (setup_logging registers it): a real subprocess, a real signal."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

SCRIPT = """
import threading, time
from agentgym.observe.logs import setup_logging
setup_logging("probe", level="warning")
def parked_in_a_worker():
    time.sleep(60)
threading.Thread(target=parked_in_a_worker, daemon=True).start()
print("ready", flush=True)
for i in range(600):
    time.sleep(0.1)
print("ran on", flush=True)
"""


def test_sigusr1_prints_every_threads_stack_and_the_process_runs_on() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT.replace("range(600)", "range(30)")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        time.sleep(0.3)
        proc.send_signal(signal.SIGUSR1)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err  # not killed by the signal
    assert "ran on" in out
    assert "parked_in_a_worker" in err  # the worker thread's frame
    assert "Current thread" in err or "Thread 0x" in err  # faulthandler's per-thread headers
