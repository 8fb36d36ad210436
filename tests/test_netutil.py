"""``free_port_pair``: the learner's two ports are drawn where no outgoing connection can take them."""

from __future__ import annotations

import socket

from agentgym.host import netutil


def test_free_port_pair_is_below_the_ephemeral_range_and_both_ports_bind() -> None:
    floor = netutil._ephemeral_floor()
    ports = [netutil.free_port_pair() for _ in range(20)]
    assert len(set(ports)) >= 15  # drawn at random: two runs beside each other rarely meet
    for port in ports:
        assert 10000 <= port and port + 1 < floor, (port, floor)
        with socket.socket() as a, socket.socket() as b:
            a.bind(("127.0.0.1", port))
            b.bind(("127.0.0.1", port + 1))


def test_a_taken_port_is_never_returned() -> None:
    # Hold every other candidate's neighbour: what comes back is still a pair that binds.
    held = []
    try:
        for _ in range(30):
            s = socket.socket()
            s.bind(("127.0.0.1", netutil.free_port_pair() + 1))
            held.append(s)
        taken = {s.getsockname()[1] for s in held}
        for _ in range(30):
            port = netutil.free_port_pair()
            assert port not in taken and port + 1 not in taken
    finally:
        for s in held:
            s.close()
