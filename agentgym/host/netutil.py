"""Small network helpers shared by the transports, the launcher's callers, tests and benchmarks."""

from __future__ import annotations

import socket

import zmq

# ZeroMQ's flags as plain ints, for both transports' per-message paths (actors/transport.py,
# learner/transport.py): pyzmq's enum members cost ~0.6 µs per ``&`` and per lookup.
EVENTS, POLLIN, POLLOUT = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.POLLOUT)
NOBLOCK, RCVMORE = int(zmq.NOBLOCK), int(zmq.RCVMORE)
MORE = int(zmq.NOBLOCK | zmq.SNDMORE)
"""A part of a multipart send with more to follow, without waiting."""


def free_port_pair(host: str = "127.0.0.1", tries: int = 200) -> int:
    """A port p such that p and p+1 are both free on ``host`` right now (the learner binds its
    control port and the next one for weights). Another process may take them before they are
    bound; callers that race with others should retry on a bind error."""
    for _ in range(tries):
        with socket.socket() as a:
            a.bind((host, 0))
            port = int(a.getsockname()[1])
            if port >= 65535:
                continue
            with socket.socket() as b:
                try:
                    b.bind((host, port + 1))
                except OSError:
                    continue
        return port
    raise RuntimeError(f"no two consecutive free ports on {host} after {tries} tries")
