"""The guardian stops what a killed process leaves behind, and only that."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import psutil

PARENT = textwrap.dedent("""
    import subprocess, sys, time
    from agentgym.host.guardian import start_guardian
    start_guardian(interval_s=0.2, grace_s=2)
    # a child that ignores SIGTERM (so the guardian must escalate) and one that does not
    stubborn = subprocess.Popen([sys.executable, "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
    plain = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print(stubborn.pid, plain.pid, flush=True)
    time.sleep(600)
""")


def test_children_of_a_killed_process_are_stopped() -> None:
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    try:
        kids = [psutil.Process(int(x)) for x in parent.stdout.readline().split()]
        time.sleep(1.0)  # the guardian has seen them
        assert all(k.is_running() for k in kids)
        parent.kill()
        parent.wait()
        gone, alive = psutil.wait_procs(kids, timeout=30)
        assert not alive, alive
        assert bystander.poll() is None  # not a descendant: untouched
    finally:
        for p in (parent, bystander):
            if p.poll() is None:
                p.kill()
        bystander.wait()


def test_guardian_exits_with_its_process_after_a_clean_exit() -> None:
    code = "from agentgym.host.guardian import start_guardian; import sys; print(start_guardian(interval_s=0.2).pid)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    guardian = psutil.Process(int(out))
    guardian.wait(timeout=30)  # raises TimeoutExpired if it lingers
