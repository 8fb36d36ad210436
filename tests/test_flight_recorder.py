"""The flight recorder: an engine whose update is mis-applied (one tensor skipped) serves a digest
that differs from the learner's export of that version, and the learner catches it at once
(logged, counted, alarmed; its rollouts of that version refused when asked); an engine that
applies the update serves the export's digest, and raises no alarm.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path

import pytest
import torch
from learner_fixtures import GOOD, PROMPTS, episode, make_cfg

from agentgym.actors.engines.hf_engine import HfEngine
from agentgym.learner.records.flight_recorder import FlightRecorder
from agentgym.learner.service import Learner
from agentgym.protocol import Ack, Heartbeat, Rollout, Ticket
from agentgym.protocol.weights import RawTensor, chunks_digest, make_chunks


@pytest.fixture(scope="module")
def model_dir(fallback_model: Path) -> Path:
    return fallback_model  # tests/conftest.py


class SkipsOne(HfEngine):
    """An engine with a bug: its update leaves one tensor as it was."""

    async def _load_weights(self, prepared: object) -> int:
        assert isinstance(prepared, Mapping)
        first = sorted(prepared)[0]
        return await super()._load_weights({k: v for k, v in prepared.items() if k != first})


def export(model_dir: Path, version: int) -> tuple[dict[str, torch.Tensor], int, int]:
    """Version ``version`` of the weights as the learner exports it: tensors, digest, count."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    torch.manual_seed(version)
    tensors = {n: (p + 0.01 * torch.randn_like(p)).contiguous() for n, p in model.state_dict().items()}
    raw = [RawTensor(n, "float32", tuple(t.shape), t.numpy().tobytes()) for n, t in tensors.items()]
    digest, count = chunks_digest(make_chunks(version, raw, 64 * 1024))  # as Learner.publish does
    return tensors, digest, count


@pytest.mark.parametrize("engine_cls", [HfEngine, SkipsOne])
def test_an_update_mis_applied_by_the_engine_is_caught_within_the_version(model_dir: Path, engine_cls: type) -> None:
    tensors, digest, count = export(model_dir, 1)
    recorder = FlightRecorder(refuse=True)
    recorder.exported(1, digest)

    async def update() -> tuple[int, int]:
        engine = engine_cls(model_dir, seed=0)
        await engine.start()
        try:
            await engine.update_weights(tensors, 1)
            return engine.weights_digest, engine.digest_tensors
        finally:
            await engine.close()

    served, covered = asyncio.run(update())
    assert covered == count  # read back for every tensor the update named
    verdict = recorder.report("a", 1, served)
    if engine_cls is HfEngine:
        assert verdict is True and not recorder.alarm and not recorder.refused("a", 1, 1)
    else:
        assert verdict is False and recorder.alarm and recorder.summary()["mismatched_actors"] == {"a": 1}
        assert recorder.refused("a", 0, 1) and not recorder.refused("a", 2, 3)  # that version's rollouts only
    assert recorder.report("a", 1, served) is None  # checked once per version


def test_the_learner_refuses_rollouts_sampled_with_misserved_weights(model_dir: Path, tmp_path: Path) -> None:
    from test_validate import Acks

    cfg = make_cfg(model_dir, "rollout.group_size=2", "learner.refuse_digest_mismatch=true")
    ln = Learner(cfg, tmp_path, trainer=None, hub=Acks())
    ln.step = 3
    ln.flight.exported(3, 1234)
    ln.sched.register("a", b"a", "h", 4)
    ln.flight.report("a", 3, 999)  # what a Heartbeat of a's would carry, as the control loop passes it
    assert Heartbeat(actor_id="a", weights_version=3, weights_digest=999).weights_digest == 999
    t = Ticket(group_id="g", env="guess_number", task_id=1)
    ln.control.guard.issue("a", [t])
    eps = [episode(PROMPTS[i], [[GOOD]], [float(i)], version=3, behav=[-0.7]) for i in range(2)]
    ln.control.on_rollout(b"a", Rollout(group_id="g", actor_id="a", env=t.env, task_id=t.task_id, episodes=eps))
    assert [m.statuses for _, m in ln.hub.sent if isinstance(m, Ack)] == [["invalid"]]
    assert (
        ln.control.guard.invalid == {"weights_digest_mismatch": 1}
        and ln.flight.metrics()["weights_digest_mismatch"] == 1
    )


def test_an_actor_reporting_forged_logprobs_is_flagged_and_honest_ones_are_not(model_dir: Path) -> None:
    import msgspec
    from learner_fixtures import bandit_rollouts

    from agentgym.learner.records.flight_recorder import LogprobAgreement
    from agentgym.learner.training.trainer import Trainer

    tr = Trainer.load(make_cfg(model_dir))
    honest = [
        msgspec.structs.replace(r, actor_id=f"h{i}", group_id=f"h{i}")
        for i, r in enumerate(bandit_rollouts(tr.model, version=tr.version))
    ]
    # the forger claims every token had probability 1 (logprob 0): not what the weights give
    forged = [
        msgspec.structs.replace(r, actor_id="forger", group_id=f"f{i}") for i, r in enumerate(bandit_rollouts(None))
    ]
    batch = honest + forged
    stats = tr.train_step(batch)
    kl = stats["group_mismatch_kl"]
    assert len(kl) == 4 and max(kl[:2]) < 1e-4 < 0.05 < min(kl[2:]), kl  # the learner's own logprobs agree
    agree = LogprobAgreement(threshold=0.05)
    assert agree.observe(1, [(r.actor_id, 0, k) for r, k in zip(batch, kl)]) == ["forger"]
    s = agree.summary()
    assert (
        s["forger"]["flagged_steps"] == 1 and s["h0"]["flagged_steps"] == 0 and agree.metrics()["logprob_outliers"] == 1
    )
    assert agree.observe(2, [("h0", 1, 0.001), ("h1", 1, 0.002)]) == []  # a healthy step raises nothing


def test_logprob_agreement_compares_actors_at_equal_lag() -> None:
    """The KL holds the policy's drift since a group's version (0.1-0.25 early in a healthy
    quickstart, groups 1-2 versions old): a group is compared only with others of its lag, and an
    actor with the other actors' median, itself left out (with two actors, a median that includes
    the forger could never be exceeded 4 times over)."""
    from agentgym.learner.records.flight_recorder import LogprobAgreement

    agree = LogprobAgreement(threshold=0.05)
    # a healthy step: drift at lag 2 for one actor, fresh groups for the other; one lone actor's drift
    assert agree.observe(1, [("a", 2, 0.24), ("a", 2, 0.2), ("b", 0, 0.001), ("b", 1, 0.08)]) == []
    assert agree.observe(2, [("a", 2, 0.24), ("b", 2, 0.19)]) == []
    assert agree.observe(3, [("solo", 1, 0.3), ("solo", 2, 0.25)]) == []
    # two actors, one forging: flagged against the other at the same lag, once per step
    assert agree.observe(4, [("forger", 1, 3.9), ("forger", 2, 4.2), ("b", 1, 0.02), ("b", 2, 0.05)]) == ["forger"]
    # a lone actor forging fresh groups (lag 0: no drift to excuse it)
    assert agree.observe(5, [("solo", 0, 3.9)]) == ["solo"]
    assert agree.summary()["forger"]["flagged_steps"] == 1 and agree.metrics()["logprob_outliers"] == 2
    # Two healthy actors' drift at one lag, 4.3 times apart but 0.044 apart (a healthy quickstart's
    # step 6, seed 0): not an outlier; a forger as far above as that, and more, is.
    assert agree.observe(6, [("local-1", 2, 0.05699), ("local-0", 2, 0.01335)]) == []
    assert agree.observe(7, [("forger", 2, 0.0134 + 0.051), ("b", 2, 0.0134)]) == ["forger"]
