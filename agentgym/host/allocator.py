"""The C allocator's settings for processes that move large messages (actors, learner).

    from agentgym.host.allocator import keep_freed_memory
    keep_freed_memory()   # once, at process start

glibc returns the top of its heap to the OS whenever more than ``M_TRIM_THRESHOLD`` (128 KiB
by default) lies free there. A rollout of ~100 KiB is allocated and freed a few times on its way
(encoded, copied into ZeroMQ, received, decoded), so each message can shrink the heap and the
next one fault its pages back in, one page fault per 4 KiB: measured on this project's transport
(docs/benchmarks.md), that was ~25 µs of the actor's ~68 µs of CPU per 106 KiB rollout. glibc
raises the threshold by itself only after it has freed a memory-mapped block (128 KiB and up),
which a process that moves 100 KiB messages may never do. ``keep_freed_memory`` sets both
thresholds at the values glibc's own adjustment would reach (mmap 32 MiB, trim twice that), from
the start: freed memory up to that size stays in the process for the next message. Larger
blocks (model weights, big tensors) still come from and return to the OS directly.

A no-op off glibc (macOS, musl), where there is nothing to set.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

import structlog

log = structlog.get_logger(__name__)

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024
"""glibc's largest automatic mmap threshold on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX)."""
TRIM_THRESHOLD_BYTES = 2 * MMAP_THRESHOLD_BYTES
"""What glibc's automatic adjustment would set along with the mmap threshold above."""


def keep_freed_memory() -> bool:
    """Set glibc's trim and mmap thresholds (see the module docstring); True if they were set."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return False
    if not hasattr(libc, "gnu_get_libc_version"):  # glibc only: musl has mallopt but ignores these options
        return False
    mallopt = libc.mallopt
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
    if not ok:
        log.warning(
            "allocator_settings_refused", mmap_threshold=MMAP_THRESHOLD_BYTES, trim_threshold=TRIM_THRESHOLD_BYTES
        )
    return ok
