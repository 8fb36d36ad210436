"""learner/records/health.py: a run with no reward signal warns once; a collapsed run is named and can stop."""

from __future__ import annotations

import numpy as np
import pytest
import structlog
from learner_fixtures import BAD, GOOD, PROMPTS, episode

from agentgym.learner.records.health import COLLAPSE_SHARE, RunHealth, episode_actions
from agentgym.protocol import Rollout


def group(actions: list[int], rewards: list[float], gi: int = 0) -> Rollout:
    eps = [episode(PROMPTS[gi % 2], [[a]], [r]) for a, r in zip(actions, rewards)]
    return Rollout(group_id=f"g{gi}", actor_id="a", env="bandit", task_id=gi, episodes=eps)


def test_turns_are_the_runs_of_agent_tokens() -> None:
    ids = np.array([1, 2, 7, 8, 3, 9, 4])
    mask = np.array([0, 0, 1, 1, 0, 1, 0])
    assert episode_actions(ids, mask) == [(7, 8), (9,)]


def test_no_signal_warns_once_and_a_settled_policy_is_a_collapse() -> None:
    names = {GOOD: "good", BAD: "bad"}
    h = RunHealth(window=3, decode=lambda ids: " ".join(names[i] for i in ids))
    with structlog.testing.capture_logs() as logs:
        # Steps 1-2: groups with different rewards (signal); then a varied but signal-free policy.
        for step in (1, 2):
            assert h.observe(step, [group([GOOD, BAD, GOOD, BAD], [1, 0, 1, 0])], entropy=0.7) is None
        for step in (3, 4, 5, 6):
            assert h.observe(step, [group([GOOD, BAD, BAD, BAD], [0, 0, 0, 0])], entropy=0.6) is None
    events = [e["event"] for e in logs]
    assert events == ["no_reward_signal"]  # after 3 signal-free steps, once
    assert logs[0]["step"] == 5 and logs[0]["reward"] == 0.0
    assert h.summary() == {"no_reward_signal_at": 5, "collapsed": None}
    # A step with signal resets the count; then the policy settles on BAD with equal rewards.
    assert h.observe(7, [group([GOOD, BAD, BAD, BAD], [1, 0, 0, 0])], entropy=0.5) is None
    assert h.metrics()["health/signal_free_steps"] == 0
    with structlog.testing.capture_logs() as logs:
        verdicts = [
            h.observe(s, [group([BAD] * 8, [0.0] * 8, gi) for gi in range(2)], entropy=0.05) for s in (8, 9, 10)
        ]
    assert verdicts[:2] == [None, None] and verdicts[2] is not None
    c = verdicts[2]
    assert c.step == 10 and c.action == "bad" and c.share >= COLLAPSE_SHARE and c.entropy == 0.05
    assert "collapsed at step 10" in c.reason and "'bad'" in c.reason
    assert [e["event"] for e in logs] == ["run_collapsed"]  # no_reward_signal is not repeated
    assert h.summary()["collapsed"]["action"] == "bad"
    # Found once: later steps in the same state return nothing new.
    assert h.observe(11, [group([BAD] * 8, [0.0] * 8)], entropy=0.05) is None


def test_the_trainers_advantage_decides_when_given() -> None:
    h = RunHealth(window=1)
    # Equal final rewards but nonzero advantages (turn-level credit): not signal-free.
    assert h.observe(1, [group([BAD] * 4, [0.0] * 4)], entropy=0.0, advantage_abs_mean=0.3) is None
    assert h.summary()["no_reward_signal_at"] is None
    assert h.observe(2, [group([BAD] * 4, [0.0] * 4)], entropy=0.0, advantage_abs_mean=0.0) is not None


def test_a_live_learner_stops_a_collapsed_run_with_exit_code_3(fallback_model, tmp_path, monkeypatch) -> None:
    """A real learner process fed, over its real sockets, groups that all play BAD for reward 0:
    after run.health_window steps it says which action, stops, and exits 3 with the reason."""
    import json

    import scripted_actor as sa
    import zmq

    def settled(t, actor, version, group_size, logprob=-0.7):
        eps = [episode(PROMPTS[0], [[BAD]], [0.0], version=version, behav=[logprob]) for _ in range(group_size)]
        return Rollout(group_id=t.group_id, actor_id=actor, env=t.env, task_id=t.task_id, episodes=eps)

    monkeypatch.setattr(sa, "play", settled)
    ctx = zmq.Context()
    with sa.LiveLearner(fallback_model, tmp_path, 50, "run.health_window=3", "run.stop_on_collapse=true") as live:
        actor = sa.ScriptedActor(ctx, live.addr, "a1", delay_s=0.01, fingerprint=live.fingerprint, group_size=sa.GROUP)
        with pytest.raises(AssertionError):  # run() expects exit code 0
            live.run([actor], timeout_s=240)
        actor.close()
        assert live.proc.returncode == 3, live.text()[-2000:]
        summary = json.loads((live.run_dir / "summary.json").read_text())
        assert summary["step"] == 3 and summary["health"]["no_reward_signal_at"] == 3
        assert summary["health"]["collapsed"]["share"] == 1.0
        assert summary["reason"].startswith("collapsed at step 3: 100% of actions are")
        assert "run_collapsed" in live.text() and "learner_stopped" in live.text()
    ctx.term()
