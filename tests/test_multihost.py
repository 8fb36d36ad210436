"""Across hosts, for real: a learner and actors in separate network namespaces (tests/netns.py),
real ``agentgym-learner``/``agentgym-actor`` processes, the quickstart tiny model.

One run, driven by ``agentgym.cluster.scenario.Scenario``:
  - actors start from another working directory with only ``--learner tcp://10.231.x.1:5555``
    (no --model, no config): they take the learner's model path from its Welcome;
  - one actor's link is cut for longer than ``learner.actor_timeout_s``, then restored: the
    learner drops it and re-issues its tickets; the actor re-registers by itself;
  - the other actor's host dies (link down, process SIGKILLed) and a new process takes its id on
    another host: ZeroMQ's pings free the id the dead connection held;
  - the learner is SIGKILLed and restarted with ``--resume``; the actors find it by themselves;
  - training runs to the end, and summary.json accounts for every issued ticket.

Asserted: the events (actor lost, rejoined, learner resumed, tickets re-opened), the exit codes,
and the ticket identity both from summary.json and recomputed here from the raw journal.
Never a timing. Skipped, with the reason, where namespaces cannot be made (not root, no ip).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
from netns import Cluster, Loopback, netns_unavailable

from agentgym.cluster.scenario import FAST, Scenario
from agentgym.models.tiny import make_default_tiny_model

AFTER_RESUME = 30
"""Steps the resumed learner trains past the step it was killed at (the run's end is set then).
Enough that both survivors rejoin it before it ends: an actor whose link is in ZeroMQ's
reconnect back-off (up to 2 s) or whose engine is still starting comes back seconds later, and
one that missed the end entirely would only stop after its connect timeout (3 steps, ~1 s, was
once too short under load)."""

NO_NETNS = netns_unavailable()


def journal_fates(path: Path) -> tuple[set[str], dict[str, str], set[str], Counter[str]]:
    """(issued ids, final fate per id, ids ever acknowledged accepted, tickets folded into counts
    by the journal's compaction per fate), replaying tickets.jsonl."""
    issued: set[str] = set()
    fate: dict[str, str] = {}
    accepted: set[str] = set()
    folded: Counter[str] = Counter()
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        if rec["e"] == "base":  # compacted at a checkpoint: what was settled for good, counted
            folded = Counter(rec["settled"])
            issued, fate = set(), {}
        elif rec["e"] == "issue":
            issued.add(rec["t"]["group_id"])
        elif rec["e"] == "reopen":
            fate.pop(rec["g"], None)
        else:
            fate[rec["g"]] = rec["e"]
            if rec["e"] == "accepted":
                accepted.add(rec["g"])
    return issued, fate, accepted, folded


@pytest.mark.skipif(NO_NETNS is not None, reason=f"no network namespaces: {NO_NETNS}")
def test_a_new_cluster_deletes_what_a_killed_one_left_and_nothing_else() -> None:
    """A run killed before its Cluster closed leaves ag<pid>-* namespaces; the next Cluster deletes
    them, and keeps those of a process still running."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    alive = subprocess.Popen(["sleep", "60"])
    left, kept = f"ag{dead.pid}-a1", f"ag{alive.pid}-sw"
    try:
        for name in (left, kept):
            subprocess.run(["ip", "netns", "add", name], check=True)
        with Cluster(["learner"]) as net:
            names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
            assert left not in names and kept in names and net.ns("learner") in names
    finally:
        alive.kill()
        for name in (left, kept):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


@pytest.mark.timeout(1200)
def test_actor_from_another_directory_takes_the_learners_model(tmp_path: Path) -> None:
    """The README's "Across machines" commands on one host: the actor runs from a directory
    with no models/ in it, with only --learner (no --model, no config), and trains."""
    model = make_default_tiny_model(tmp_path / "shared" / "tiny", seed=0)
    with Loopback(["learner", "a1"]) as net:
        sc = Scenario(net, tmp_path, model.resolve(), [*FAST, "run.max_steps=2"])
        a1 = sc.start_actor("a1")
        sc.start_learner()
        sc.wait(lambda: sc.learner.poll() is not None, 600, "the learner to finish")  # type: ignore[union-attr]  # the learner was started
        assert sc.learner.returncode == 0, sc.tail("learner")  # type: ignore[union-attr]  # the learner was started
        assert sc.actors[a1].wait(timeout=60) == 0, sc.tail(a1)
    assert not (sc.actor_home / "models").exists()
    assert [e["actor_id"] for e in sc.events("actor_asked_model")][:1] == [a1]
    assert sc.summary()["step"] == 2 and sc.summary()["tickets"]["trained"] == 2 * 4


@pytest.mark.skipif(NO_NETNS is not None, reason=f"no network namespaces: {NO_NETNS}")
@pytest.mark.timeout(1500)  # a few minutes on an idle 2-core machine; much more under heavy load
def test_learner_and_actors_on_three_hosts_survive_cuts_and_kills(tmp_path: Path) -> None:
    model = make_default_tiny_model(tmp_path / "shared" / "tiny", seed=0)
    with Cluster(["learner", "a1", "a2"]) as net:
        sc = Scenario(net, tmp_path, model.resolve(), [*FAST, "run.max_steps=1000"])
        a1 = sc.start_actor("a1")
        a2 = sc.start_actor("a2")
        sc.start_learner()
        sc.wait(lambda: sc.step() >= 2, 400, "2 steps")

        # A link lost for longer than actor_timeout_s (6 s): the learner drops the actor and
        # re-issues its tickets; back on the wire, the actor registers again by itself.
        # (Counted from here: on a loaded machine an actor may also be dropped, and come back,
        # while its engine starts.)
        def of(event: str, actor_id: str) -> list[dict]:
            return [e for e in sc.events(event) if e["actor_id"] == actor_id]

        lost = lambda: of("actor_lost", a1)  # noqa: E731
        joined = lambda: of("actor_joined", a1)  # noqa: E731
        lost_before, joined_before = len(lost()), len(joined())
        net.cut("a1")
        sc.wait(lambda: len(lost()) > lost_before, 120, "actor_lost for a1")
        time.sleep(2)
        net.restore("a1")
        sc.wait(lambda: len(joined()) > joined_before, 240, "a1 to register again")
        cut_lost = lost()[lost_before]
        at = sc.step()
        sc.wait(lambda: sc.step() >= at + 1, 300, "a step after the link came back")

        # An actor's host dies without a word (its link down, then the process killed: no FIN, no
        # RST ever reaches the learner), and a new process takes its place under the same id on
        # another host. The learner drops the old one after actor_timeout_s; ZeroMQ's pings close
        # the dead connection, which held the id (a ROUTER never reads a connection that comes
        # under an id it still holds), so the new one is read and registers.
        # (Counted from here, as above: a2 may have been dropped once already while it started.)
        lost_before = len(of("actor_lost", a2))
        net.cut("a2")
        sc.kill(sc.actors[a2])
        sc.wait(lambda: len(of("actor_lost", a2)) > lost_before, 120, "actor_lost for a2")
        joins = len(of("actor_joined", a2))
        a3 = sc.start_actor("a1", actor_id=a2)
        sc.wait(lambda: len(of("actor_joined", a3)) > joins, 240, "the new actor")

        # The learner dies after a checkpoint and past it (so some trained groups are lost).
        sc.wait(lambda: bool(sc.checkpoints()) and sc.step() > sc.checkpoints()[-1], 400, "a step past a checkpoint")
        assert sc.learner is not None
        sc.kill(sc.learner)
        killed_at, resumed_from = sc.step(), sc.checkpoints()[-1]
        steps = killed_at + AFTER_RESUME
        sc.start_learner(resume=True, extra=[f"run.max_steps={steps}"])
        sc.wait(lambda: sc.learner.poll() is not None, 600, "the resumed learner to finish")  # type: ignore[union-attr]  # the learner was started
        assert sc.learner.returncode == 0, sc.tail("learner")
        for actor_id in (a1, a3):
            try:
                code = sc.actors[actor_id].wait(timeout=60)
            except subprocess.TimeoutExpired:
                raise AssertionError(
                    f"{actor_id} did not stop after the learner finished:\n{sc.tail(actor_id)}"
                ) from None
            assert code == 0, sc.tail(actor_id)

    # What happened, from the learner's own log.
    assert cut_lost["tickets_returned"] >= 1  # a1's tickets went back to the queue
    assert [e["step"] for e in sc.events("learner_resumed")] == [resumed_from]
    reopened = sc.events("tickets_reopened")
    assert len(reopened) == 1 and reopened[0]["count"] >= 1
    assert killed_at > resumed_from
    # Both survivors played for the resumed learner: they reconnected by themselves.
    actors = {p.stem: json.loads(p.read_text()) for p in sc.actor_home.glob("*/actors/*.json")}
    assert set(actors) == {a1, a3}
    assert all(a["reason"] == "learner: run finished" for a in actors.values()), actors

    summary = sc.summary()
    assert summary["step"] == steps and summary["reason"] == "run finished"
    t = summary["tickets"]
    assert t["unaccounted"] == 0 and t["accepted_not_buffered"] == 0, t
    parts = ("trained", "expired", "stale", "invalid", "failed", "untrained_at_end", "in_flight_at_end")
    assert t["issued"] == sum(t[k] for k in parts), t
    assert t["trained"] == steps * 4  # batch_groups = 4: what the final weights were trained on
    assert t["reissued"] >= 1  # a1's tickets (and the dead actor's, once the learner noticed)
    assert sum(t["lost_in_restart"].values()) == reopened[0]["count"]

    # The same identity, recomputed from the raw journal: every ticket issued has one fate or
    # is still open at the end, and every group ever acknowledged as accepted ended trained,
    # expired, or re-opened and then settled — none is simply gone.
    issued, fate, accepted, folded = journal_fates(sc.run_dir / "tickets.jsonl")
    assert len(issued) + sum(folded.values()) == t["issued"]
    counts = Counter(fate.values()) + folded
    assert counts["trained"] == t["trained"] and counts.get("accepted", 0) == t["untrained_at_end"]
    assert len(issued - fate.keys()) == t["in_flight_at_end"]
    for g in accepted:
        assert g not in fate or fate[g] in ("trained", "expired", "accepted", "stale"), (g, fate.get(g))
