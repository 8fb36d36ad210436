"""The webshop env's Chromium: how it is found, launched, and cleaned up after when it dies.

The env (env.py) starts Playwright's Node driver with its TMPDIR pointed at a directory of its
own (``TMP_PREFIX<pid>-XXXX``), so Chromium's profile lives there; a hung browser's processes
are killed below the driver (``kill_descendants``); profiles left by workers that were killed
outright are swept by the next env to start or close (``sweep_dead_tmpdirs``).
"""

from __future__ import annotations

import shutil
import signal
import tempfile
from pathlib import Path

# The background-networking flags matter on a closed network: without them Chromium keeps trying
# to reach Google's services (updates, sync, QUIC probes) and floods it with failing requests.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
LAUNCH_TIMEOUT_S = 60.0
"""Deadline for Chromium to start (a few seconds on an idle machine, more on a loaded one)."""
TMP_PREFIX = "agentgym-webshop-"
"""Each env's own temp directory, ``TMP_PREFIX<pid>-XXXX``: the driver's TMPDIR, so Chromium's
profile lives there. A killed worker cannot delete its own; the next env to start or close
removes those of processes that are gone."""


class BrowserFailure(RuntimeError):
    """Chromium (or Playwright's driver) died, hung or refused; fails the episode, not the worker."""


def find_chromium(chromium: object) -> str:
    """The Chromium executable the ``chromium`` option names (a path or a name on PATH), or a
    ``FileNotFoundError`` saying how to get one."""
    found = shutil.which(chromium) if isinstance(chromium, str) and chromium else None
    if found is None:
        raise FileNotFoundError(
            f"webshop: option chromium={chromium!r} is not an executable Chromium; install Debian's "
            "chromium (apt-get install chromium; scripts/system-packages.txt lists it) or point the option "
            "at a Chromium binary"
        )
    return found


def sweep_dead_tmpdirs() -> None:
    """Remove the temp directories (Chromium profiles) of webshop envs whose process is gone."""
    import psutil

    for d in Path(tempfile.gettempdir()).glob(f"{TMP_PREFIX}*"):
        try:
            pid = int(d.name[len(TMP_PREFIX) :].split("-", 1)[0])
        except ValueError:
            continue
        try:
            alive = psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            alive = False
        if not alive:
            shutil.rmtree(d, ignore_errors=True)


def child_pids() -> set[int]:
    import psutil

    return {p.pid for p in psutil.Process().children()}


def kill_descendants(pids: set[int]) -> None:
    """SIGKILL every process below ``pids`` (the driver's Chromium and its helpers)."""
    import psutil

    for pid in pids:
        try:
            procs = psutil.Process(pid).children(recursive=True)
        except psutil.Error:
            continue  # the driver is gone; its browser went with it or will notice the pipe
        for proc in procs:
            try:
                proc.send_signal(signal.SIGKILL)
            except psutil.Error:
                pass  # already gone
