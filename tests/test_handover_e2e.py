"""Hand-over across processes: a real learner and actors (agentgym.cluster.scenario.Scenario on loopback),
episodes of 12 turns (guess_number over 1..1000), the first actor SIGTERMed mid-run.

Asserted: the actor exits 0 after sending its live episodes in its Leave; a second actor takes
those tickets, replays the actions and continues; every continued episode the learner accepted
starts with exactly the tokens the first actor handed over (sha256 of the prefix, logged on both
sides); the run trains to the end and the ticket accounting holds with each handed-over group
trained once (nothing counted twice). The token-level identity of prefix and continuation is
tests/test_handover.py's.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from netns import Loopback

from agentgym.cluster.scenario import FAST, Scenario
from agentgym.models.tiny import make_default_tiny_model

LONG = [
    "env.kwargs={low=1, high=1000}",
    "schedule.turn_limits=[[0, 12]]",
    "rollout.max_episode_tokens=512",
    "learner.batch_groups=2",
    "learner.max_staleness=4",
]
"""Episodes of 12 turns (a number in 1..1000 is rarely guessed): an actor that always plays has
episodes mid-play whenever it is stopped."""


@pytest.mark.timeout(900)
def test_a_sigtermed_actors_episodes_are_finished_by_another(tmp_path: Path) -> None:
    model = make_default_tiny_model(tmp_path / "shared" / "tiny", seed=0)
    with Loopback(["learner", "a1", "a2"]) as net:
        sc = Scenario(net, tmp_path, model.resolve(), [*FAST, *LONG, "run.max_steps=3", "rollout.group_size=4"])
        a1 = sc.start_actor("a1")
        sc.start_learner()
        sc.wait(lambda: sc.step() >= 1, 400, "a first step")
        sc.actors[a1].send_signal(15)
        assert sc.actors[a1].wait(timeout=120) == 0, sc.tail(a1)
        a2 = sc.start_actor("a2")
        sc.wait(lambda: sc.learner.poll() is not None, 600, "the learner to finish")  # type: ignore[union-attr]  # the learner was started
        assert sc.learner.returncode == 0, sc.tail("learner")  # type: ignore[union-attr]  # the learner was started
        assert sc.actors[a2].wait(timeout=60) == 0, sc.tail(a2)

    received = sc.events("handover_received")
    assert received and all(e["actor_id"] == a1 for e in received), sc.tail("learner")
    handed = {e["group"] for e in received}
    prefixes = Counter(p for e in received for p in e["prefixes"])
    resumed = sc.events("episode_resumed")
    assert resumed and all(e["actor_id"] == a2 and e["group"] in handed for e in resumed)
    # Each continued episode starts with exactly one of the prefixes handed over, each used once.
    used = Counter(e["prefix"] for e in resumed)
    assert all(used[p] <= prefixes[p] for p in used), (used, prefixes)
    assert sum(used.values()) == sum(prefixes.values())

    summary = sc.summary()
    t = summary["tickets"]
    parts = ("trained", "expired", "stale", "invalid", "failed", "untrained_at_end", "in_flight_at_end")
    assert t["unaccounted"] == 0 and t["issued"] == sum(t[k] for k in parts), t
    assert t["trained"] == 3 * 2 and t["handovers"]["groups"] == len(received)
    assert t["handovers"]["episodes_resumed_accepted"] == len(resumed)
    # Every handed-over group has one fate in the journal, and was trained at most once.
    fates: dict[str, list[str]] = {}
    for line in (sc.run_dir / "tickets.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if "g" in rec:
            fates.setdefault(rec["g"], []).append(rec["e"])
    for g in handed:
        assert fates.get(g, []).count("trained") <= 1, (g, fates.get(g))
    stats = json.loads((sc.actor_home / "a1" / "actors" / f"{a1}.json").read_text())
    assert stats["handover_groups"] == len(received) and stats["reason"] == "got SIGTERM"
