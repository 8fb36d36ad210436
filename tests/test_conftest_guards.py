"""The test process's own guards (tests/conftest.py) do what they say."""

from __future__ import annotations

import gc
import threading

import pytest
import zmq


def test_a_context_dropped_in_garbage_with_its_open_socket_does_not_hang_the_collector() -> None:
    # What a failed check leaves behind: a context and an open socket with a message waiting to
    # go, held only by garbage (here a dict that holds itself, as a traceback's frames do).
    gc.disable()  # collected below, inside the checks, and not earlier by chance
    try:
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.connect("tcp://127.0.0.1:9")
        sock.send(b"never delivered")
        garbage = {"ctx": ctx, "sock": sock}
        garbage["self"] = garbage
        del ctx, sock, garbage
        collected = threading.Event()
        with pytest.warns(ResourceWarning, match="left to the garbage collector"):
            worker = threading.Thread(target=lambda: (gc.collect(), collected.set()), daemon=True)
            worker.start()
            assert collected.wait(30), "the garbage collector hung in zmq.Context.__del__ (term)"
    finally:
        gc.enable()
