"""agentgym/host/allocator.py: freed message buffers stay in the process instead of being faulted back in.

Each case runs in a fresh interpreter (the allocator's settings are per process) and counts the
page faults of a loop that builds and drops a 106 KiB buffer twice per round, the way a rollout
is encoded and copied into ZeroMQ. Page faults are counted by the kernel, not timed.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

LOOP = r"""
import json, resource, sys
tuned = False
if sys.argv[1] == "tuned":
    from agentgym.host.allocator import keep_freed_memory
    tuned = keep_freed_memory()
faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
rounds, f0 = 2000, faults()
for _ in range(rounds):
    a = bytearray(106 * 1024)
    a[::4096] = b"x" * len(a[::4096])
    b = bytes(a)
    del a, b
print(json.dumps({"tuned": tuned, "faults_per_round": (faults() - f0) / rounds}))
"""


def faults_per_round(mode: str) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", LOOP, mode], capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator settings")
def test_keep_freed_memory_stops_a_page_fault_per_4_kib_of_every_message() -> None:
    default = faults_per_round("default")
    if default["faults_per_round"] < 5:
        pytest.skip(
            f"this C library does not return the freed buffers to the OS ({default['faults_per_round']:.1f} faults a round)"
        )
    tuned = faults_per_round("tuned")
    assert tuned["tuned"] is True
    # Default glibc: ~21 faults a round (the heap's top is given back and faulted in again);
    # kept: the same memory serves every round.
    assert tuned["faults_per_round"] < 1, tuned
