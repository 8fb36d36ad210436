"""A watcher process that cleans up after a process that dies without cleaning up itself.

    from agentgym.host.guardian import start_guardian
    start_guardian()   # first thing in a role's main(), before any child process exists

An actor owns child processes it did not write: vLLM's engine core and its workers, the env
workers. When the actor is killed (``kill -9``, the OOM killer, a node agent) nothing in it
runs, and vLLM's engine core would wait forever on a socket whose other end is gone, holding
its memory. The guardian is a small separate process (own session, so a Ctrl-C to the
terminal's process group does not reach it) that notes the watched process's descendants once
a second and, when the watched process is gone, terminates the ones still running (SIGTERM,
then SIGKILL after ``grace_s``). After a clean exit there is usually nothing left to do.
psutil checks process identity by start time, so a recycled PID is never signalled.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import psutil


def start_guardian(pid: int | None = None, *, interval_s: float = 1.0, grace_s: float = 5.0) -> subprocess.Popen:
    """Start a guardian for ``pid`` (default: this process); returns its handle."""
    pid = os.getpid() if pid is None else pid
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agentgym.host.guardian",
            str(pid),
            "--interval",
            str(interval_s),
            "--grace",
            str(grace_s),
        ],
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        close_fds=True,
    )


def guard(pid: int, interval_s: float, grace_s: float) -> int:
    """Watch ``pid``; once it is gone, stop the descendants it left. Returns how many were left."""
    try:
        watched = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return 0
    me = os.getpid()
    known: dict[int, psutil.Process] = {}
    while True:
        try:
            if not watched.is_running() or watched.status() == psutil.STATUS_ZOMBIE:
                break
            for child in watched.children(recursive=True):
                if child.pid != me:
                    known.setdefault(child.pid, child)
        except psutil.NoSuchProcess:
            break
        time.sleep(interval_s)
    left = [p for p in known.values() if p.is_running()]
    for p in left:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(left, timeout=grace_s)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    return len(left)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m agentgym.host.guardian", description=__doc__.split("\n\n")[0])
    p.add_argument("pid", type=int, help="process to watch")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between looks at the process tree")
    p.add_argument("--grace", type=float, default=5.0, help="seconds between SIGTERM and SIGKILL of leftovers")
    args = p.parse_args(argv)
    guard(args.pid, args.interval, args.grace)
    return 0


if __name__ == "__main__":
    sys.exit(main())
