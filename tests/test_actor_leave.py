"""Asking an actor to leave from the learner's side, and leaving without hand-over: real learner
and actor processes on loopback (agentgym.cluster.scenario.Scenario), real sockets, the real CLI.

  - ``agentgym actors leave ID --run RUN_DIR`` for an id the learner does not know exits 1 and
    names the registered actors;
  - for a live actor: the learner sends the request, the actor leaves as on SIGTERM (its live
    episodes handed over in its Leave) and exits 0, the command reports the departure, and
    another actor continues the handed-over episodes;
  - an actor with ``actor.handover = false`` leaves on SIGTERM at once: nothing handed over, its
    tickets issued again; its sampled tokens are all accounted for (sent, or lost);
  - the run trains to the end with every ticket accounted for.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from netns import Loopback

from agentgym.cluster.scenario import FAST, Scenario
from agentgym.models.tiny import make_default_tiny_model

LONG = [
    # Each env step waits 0.1 s (no CPU): one actor alone cannot finish the run (9 steps of 8
    # episodes of 12 turns on its 4 env workers: at least 22 s) while the leave command starts,
    # however fast its engine is (at 1 torch thread, 12 steps took 16 s beside a loaded machine).
    "env.kwargs={low=1, high=1000, step_latency_s=0.1}",
    "schedule.turn_limits=[[0, 12]]",
    "rollout.max_episode_tokens=512",
    "learner.batch_groups=2",
    "learner.max_staleness=4",
    "rollout.group_size=4",
]


STEPS = 10


def leave(run_dir: Path, actor_id: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agentgym.cli", "actors", "leave", actor_id, "--run", str(run_dir), "--timeout", "120"],
        capture_output=True,
        text=True,
        timeout=200,
    )


@pytest.mark.timeout(900)
def test_the_learner_asks_an_actor_to_leave_and_an_actor_without_handover_leaves_at_once(tmp_path: Path) -> None:
    model = make_default_tiny_model(tmp_path / "shared" / "tiny", seed=0)
    with Loopback(["learner", "a1", "a2", "a3"]) as net:
        # STEPS: one actor alone must not finish the run before the CLI call below is answered
        sc = Scenario(net, tmp_path, model.resolve(), [*FAST, *LONG, f"run.max_steps={STEPS}"])
        a1 = sc.start_actor("a1")
        sc.start_learner()
        sc.wait(lambda: any(e["actor_id"] == a1 for e in sc.events("actor_joined")), 400, "the first actor")

        unknown = leave(sc.run_dir, "nobody")
        assert unknown.returncode == 1 and "no actor 'nobody'" in unknown.stderr and a1 in unknown.stderr, unknown

        sc.wait(lambda: sc.step() >= 1, 400, "a first step")
        asked = leave(sc.run_dir, a1)
        assert asked.returncode == 0, (asked.stdout, asked.stderr, sc.tail("learner"))
        assert f"actor {a1} left" in asked.stdout, asked.stdout
        assert sc.actors[a1].wait(timeout=120) == 0, sc.tail(a1)

        # Without hand-over: SIGTERM once the learner trained a group of its (so its engine has
        # sampled tokens, which env_pool_started alone does not promise), and it leaves at once.
        a2 = sc.start_actor("a2", ["actor.handover=false"])
        sc.wait(lambda: sc.trained_on(a2), 400, "a group of the second actor")
        sc.actors[a2].send_signal(15)
        assert sc.actors[a2].wait(timeout=120) == 0, sc.tail(a2)

        a3 = sc.start_actor("a3")
        sc.wait(lambda: sc.learner.poll() is not None, 600, "the learner to finish")  # type: ignore[union-attr]  # the learner was started
        assert sc.learner.returncode == 0, sc.tail("learner")  # type: ignore[union-attr]  # the learner was started
        assert sc.actors[a3].wait(timeout=60) == 0, sc.tail(a3)

    asked_events = sc.events("actor_asked_to_leave")
    assert [e["actor_id"] for e in asked_events] == [a1]
    left = {e["actor_id"]: e for e in sc.events("actor_left")}
    received = sc.events("handover_received")
    assert received and {e["actor_id"] for e in received} == {a1}, sc.tail("learner")
    assert left[a1]["handed_over"] == len(received) and left[a2]["handed_over"] == 0
    assert left[a2]["tickets_returned"] >= 1, left[a2]
    resumed = sc.events("episode_resumed")
    assert resumed and all(e["actor_id"] in (a2, a3) for e in resumed)

    s1 = json.loads((sc.actor_home / "a1" / "actors" / f"{a1}.json").read_text())
    assert s1["reason"] == "learner asked this actor to leave: agentgym actors leave", s1
    assert s1["handover_groups"] == len(received)
    s2 = json.loads((sc.actor_home / "a2" / "actors" / f"{a2}.json").read_text())
    assert s2["reason"] == "got SIGTERM" and "handover_groups" not in s2, s2
    # Every token a2's engine sampled was sent or lost (none handed over).
    assert s2.get("sampled_tokens_handed_over", 0) == 0
    assert (
        s2["sampled_tokens"] == s2.get("sampled_tokens_sent", 0) + s2["sampled_tokens_lost"]
        and s2["sampled_tokens"] > 0
    ), s2

    t = sc.summary()["tickets"]
    parts = ("trained", "expired", "stale", "invalid", "failed", "untrained_at_end", "in_flight_at_end")
    assert t["unaccounted"] == 0 and t["issued"] == sum(t[k] for k in parts), t
    assert t["trained"] == STEPS * 2 and t["handovers"]["groups"] == len(received)


def test_a_leave_request_nobody_answers_is_withdrawn_and_bad_arguments_exit_2(tmp_path: Path) -> None:
    def cli(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "agentgym.cli", "actors", "leave", *argv], capture_output=True, text=True, timeout=60
        )

    assert cli("a1", "--run", str(tmp_path)).returncode == 2  # no config.toml: not a run directory
    (tmp_path / "config.toml").write_text("")
    bad = cli("../a1", "--run", str(tmp_path))
    assert bad.returncode == 2 and "actor id '../a1'" in bad.stderr, bad.stderr
    late = cli("a1", "--run", str(tmp_path), "--timeout", "1")  # no learner reads the requests
    assert late.returncode == 1 and "withdrawn" in late.stderr, late.stderr
    assert not list((tmp_path / "requests" / "leave").iterdir())
