"""Small network helpers shared by the transports, the launcher's callers, tests and benchmarks."""

from __future__ import annotations

import random
import socket
from pathlib import Path
from typing import Any

import zmq

# ZeroMQ's flags as plain ints, for both transports' per-message paths (actors/transport.py,
# learner/transport.py): pyzmq's enum members cost ~0.6 µs per ``&`` and per lookup.
EVENTS, POLLIN, POLLOUT = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.POLLOUT)
NOBLOCK, RCVMORE = int(zmq.NOBLOCK), int(zmq.RCVMORE)
MORE = int(zmq.NOBLOCK | zmq.SNDMORE)
"""A part of a multipart send with more to follow, without waiting."""


def log_send_drop(log: Any, event: str, peer: bytes, exc: zmq.ZMQError, count: int, queued_cap: int) -> None:
    """Log a send a mandatory ROUTER refused (``count``: the drops so far): the first 20 and every
    1,000th after, so a peer that never reads does not flood the log. A peer that is gone (it
    left, or its connection was dropped) is routine: a debug line; a full queue is a peer that
    does not read: a warning. Used by the learner's ROUTERs and a relay's."""
    if exc.errno == zmq.EHOSTUNREACH:
        log.debug(event, peer=peer.hex(), reason="peer_gone", count=count)
    elif count <= 20 or count % 1000 == 0:
        reason = "queue_full" if exc.errno == zmq.EAGAIN else exc.strerror
        log.warning(event, peer=peer.hex(), reason=reason, queued_cap=queued_cap, count=count)


def _ephemeral_floor() -> int:
    """The lowest port the kernel gives an outgoing connection's local end (Linux's
    ``ip_local_port_range``; 32768 where it cannot be read)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port_pair(host: str = "127.0.0.1", tries: int = 200) -> int:
    """A port p such that p and p+1 are both free on ``host`` right now (the learner binds its
    control port and the next one for weights). Another process may take them before they are
    bound; callers that race with others should retry on a bind error.

    The port is drawn at random below the kernel's ephemeral range, where no outgoing connection
    is ever given its local end: a pair drawn by ``bind(("", 0))`` inside that range was taken
    between this check and the learner's bind by a connection elsewhere on the machine (Linux
    gives bind(0) odd ports and connect() even ones, so p+1 is the kind a connection takes)."""
    floor = _ephemeral_floor()
    draw = random.Random()
    for _ in range(tries):
        if floor - 2 > 10000:
            port = draw.randrange(10000, floor - 2)
        else:  # no room below the ephemeral range: let the kernel pick
            with socket.socket() as a:
                a.bind((host, 0))
                port = int(a.getsockname()[1])
            if port >= 65535:
                continue
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind((host, port))
                b.bind((host, port + 1))
        except OSError:
            continue
        return port
    raise RuntimeError(f"no two consecutive free ports on {host} after {tries} tries")


_ZMTP_SIGNATURE = b"\xff" + b"\0" * 8 + b"\x7f"
"""The first 10 bytes of a ZMTP 3 greeting (rfc.zeromq.org/spec/23); the 11th is the major version."""


def zmtp_mechanism(addr: str, timeout_s: float = 1.0) -> str | None:
    """The security mechanism ("NULL", "PLAIN", "CURVE") that the ZeroMQ socket bound at ``addr``
    (``tcp://host:port`` or ``ipc://path``) announces in its greeting; None when no ZMTP 3
    greeting comes back in time (nothing listening, not ZeroMQ, a reset). It sends only the start
    of a greeting and closes, so the peer sees one failed handshake and nothing else."""
    try:
        if addr.startswith("tcp://"):
            host, _, port = addr[len("tcp://") :].rpartition(":")
            conn = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s)
        elif addr.startswith("ipc://"):
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.settimeout(timeout_s)
            conn.connect(addr[len("ipc://") :])
        else:
            return None
        with conn:
            conn.sendall(_ZMTP_SIGNATURE + b"\x03")
            greeting = b""
            while len(greeting) < 32:
                part = conn.recv(64 - len(greeting))
                if not part:
                    break
                greeting += part
    except (OSError, ValueError):
        return None
    if len(greeting) < 32 or greeting[0] != 0xFF or greeting[9] != 0x7F or greeting[10] < 3:
        return None
    return greeting[12:32].rstrip(b"\0").decode("ascii", "replace")
