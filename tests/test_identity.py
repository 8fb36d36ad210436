"""One key, one identity, against a live learner process over real sockets: with CURVE keys an
actor id belongs to the key that registered it (another key can neither register under it nor
touch its tickets); without keys a Hello of another process under a live actor's id is refused
while the actor's own reconnect is welcome; token versions outside [0, learner version] are
``invalid``.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import zmq
from scripted_actor import GROUP, LiveLearner, ScriptedActor, play

from agentgym.auth.keys import ClientKeys, write_keys
from agentgym.protocol import Grant, Reject, Welcome


@pytest.fixture(scope="module")
def model_dir(fallback_model: Path) -> Path:
    return fallback_model  # tests/conftest.py


def until(actor: ScriptedActor, ok, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while not ok():
        assert time.monotonic() < deadline, actor.got[-5:]
        actor.step(20)


def test_an_actor_id_is_its_keys_and_future_versions_are_invalid(model_dir: Path, tmp_path: Path) -> None:
    k = tmp_path / "keys"
    write_keys(k, ["one", "two"])
    key = {n: ClientKeys.load(k / "actors" / f"{n}.key_secret", k / "learner.key") for n in ("one", "two")}
    with LiveLearner(model_dir, tmp_path, 2, keys=k) as ln:
        ctx = zmq.Context()
        first = ScriptedActor(
            ctx, ln.addr, "a", delay_s=None, fingerprint=ln.fingerprint, group_size=GROUP, keys=key["one"]
        )
        until(first, lambda: first.granted)
        held = list(first.granted)
        first.close()  # gone from ZeroMQ, still registered with the learner: its id is free to connect under
        time.sleep(1.0)
        thief = ScriptedActor(
            ctx, ln.addr, "a", delay_s=None, fingerprint=ln.fingerprint, group_size=GROUP, keys=key["two"]
        )
        until(thief, lambda: any(isinstance(m, Reject) for m in thief.got))
        (rej,) = [m for m in thief.got if isinstance(m, Reject)]
        assert rej.field == "actor_id" and "another CURVE key" in rej.reason
        assert not any(isinstance(m, Welcome | Grant) for m in thief.got)  # none of a's tickets
        thief.send(play(held[0], "a", 0, GROUP))  # nor may it answer them
        thief.step(300)
        assert held[0].group_id not in thief.acks
        thief.close()
        time.sleep(1.0)  # the learner's side of the refused connection ends first (see the test below)
        # The owner's key gets its id, and its tickets, back; a group from the future is invalid.
        back = ScriptedActor(
            ctx, ln.addr, "a", delay_s=None, fingerprint=ln.fingerprint, group_size=GROUP, keys=key["one"]
        )
        until(back, lambda: back.welcomed and back.granted)
        assert held[0].group_id in {t.group_id for t in back.granted}
        future = play(back.granted[0], "a", 10**6, GROUP)
        back.send(future)
        until(back, lambda: future.group_id in back.acks)
        assert back.acks[future.group_id] == "invalid"
        back.delay_s = 0.0  # now it plays honestly: what it holds, and what it is granted next
        back.due = [(0.0, t) for t in back.granted[1:]]
        summary = ln.run([back])
        back.close()
        ctx.term()
        assert summary["step"] == 2
        assert summary["dropped_messages"]["actor_id_of_another_key"] >= 2  # the Hello and the rollout
        assert summary["invalid_reasons"] == {"version_out_of_range": 1}


def test_without_keys_a_live_id_is_refused_to_another_process(model_dir: Path, tmp_path: Path) -> None:
    with LiveLearner(model_dir, tmp_path, 2) as ln:
        ctx = zmq.Context()
        first = ScriptedActor(
            ctx, ln.addr, "b", delay_s=None, fingerprint=ln.fingerprint, group_size=GROUP, session="s1"
        )
        until(first, lambda: first.granted)
        held = {t.group_id for t in first.granted}
        first.close()
        # ZeroMQ ignores a connection under a routing id it still holds: let the learner's side of
        # the closed one end first (a second process starts later than this anyway).
        time.sleep(1.0)
        other = ScriptedActor(
            ctx, ln.addr, "b", delay_s=None, fingerprint=ln.fingerprint, group_size=GROUP, session="s2"
        )
        until(other, lambda: any(isinstance(m, Reject) for m in other.got))
        assert [m.field for m in other.got if isinstance(m, Reject)] == ["actor_id"]
        assert not other.granted
        other.close()
        time.sleep(1.0)  # as above: the learner's side of the refused connection ends first
        same = ScriptedActor(ctx, ln.addr, "b", delay_s=0.0, fingerprint=ln.fingerprint, group_size=GROUP, session="s1")
        until(same, lambda: same.welcomed and held <= {t.group_id for t in same.granted})  # its own tickets again
        summary = ln.run([same])
        same.close()
        ctx.term()
        assert summary["step"] == 2 and summary["dropped_messages"] == {"actor_id_in_use": 1}
