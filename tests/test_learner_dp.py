"""Data-parallel learner: 2 real gloo ranks (two processes over torch.distributed) take the same
optimizer steps as 1 rank on the same global batch."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from learner_fixtures import bandit_rollouts, make_cfg

from agentgym.learner.training.trainer import Trainer
from agentgym.models.tiny import FALLBACK_CORPUS, make_tiny_model

# Every path that crosses ranks: the no-grad pass (π_prox, values, π_ref summed over ranks),
# several minibatches, gradient accumulation, the value head, KL and entropy terms, and an
# uneven split (3 rows per minibatch over 2 ranks: one rank gets 2 rows, the other 1).
COMMON = (
    "learner.algorithm=ppo",
    "learner.minibatches=2",
    "learner.micro_batch_tokens=16",
    "learner.kl_coef=0.05",
    "learner.entropy_coef=0.01",
    "learner.lr=3e-3",
    "learner.dist_timeout_s=300",
)
METRICS = (
    "loss",
    "pg_loss",
    "value_loss",
    "kl_ref",
    "entropy",
    "grad_norm",
    "clip_frac",
    "approx_kl",
    "is_weight_mean",
    "explained_variance",
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("dp") / "m", corpus=FALLBACK_CORPUS, seed=0)


def _steps(tr: Trainer, n: int) -> list[dict[str, float]]:
    return [tr.train_step(bandit_rollouts(version=tr.version, group_size=3)) for _ in range(n)]


@pytest.mark.slow
@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean"])
def test_two_gloo_ranks_update_the_weights_like_one_rank(model_dir: Path, agg: str) -> None:
    one = Trainer.load(make_cfg(model_dir, *COMMON, f"learner.loss_agg={agg}"))
    m_one = _steps(one, 2)

    two = Trainer.load(make_cfg(model_dir, *COMMON, f"learner.loss_agg={agg}", "learner.dp_size=2"))
    try:
        assert dist.is_initialized() and dist.get_backend() == "gloo" and dist.get_world_size() == 2
        assert two.dp.procs is not None and all(p.is_alive() for p in two.dp.procs)
        m_two = _steps(two, 2)
        assert two.rank_divergence() == 0.0  # rank 1 holds exactly rank 0's weights
    finally:
        two.close()
    assert not dist.is_initialized()
    assert two.dp.procs is not None and all(p.exitcode == 0 for p in two.dp.procs)

    for a, b in zip(m_one, m_two, strict=True):
        assert (a["trained_tokens"], a["optimizer_steps"]) == (b["trained_tokens"], b["optimizer_steps"]) == (6.0, 2.0)
        for k in METRICS:
            assert a[k] == pytest.approx(b[k], rel=1e-4, abs=1e-6), k
    # every row trained once, on one rank or the other (a budget of 16 tokens puts each row alone)
    assert m_one[0]["micro_batches"] == m_two[0]["micro_batches"] == 6.0
    for (k, p), q in zip(one.model.state_dict().items(), two.model.state_dict().values(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5, msg=k)
    assert one.value_head is not None and two.value_head is not None
    torch.testing.assert_close(one.value_head.linear.weight, two.value_head.linear.weight, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_two_gloo_ranks_train_a_separate_critic_like_one_rank(model_dir: Path) -> None:
    cfg = (*COMMON, 'learner.value_model="separate"', "learner.value_lr=1e-2")
    one = Trainer.load(make_cfg(model_dir, *cfg))
    m_one = _steps(one, 2)
    two = Trainer.load(make_cfg(model_dir, *cfg, "learner.dp_size=2"))
    try:
        m_two = _steps(two, 2)
        assert two.rank_divergence() == 0.0  # the critic's weights too: they are in two.params
    finally:
        two.close()
    for a, b in zip(m_one, m_two, strict=True):
        for k in (*METRICS, "value_grad_norm"):
            assert a[k] == pytest.approx(b[k], rel=1e-4, abs=1e-6), k
    assert one.value_head is not None and two.value_head is not None
    for (k, p), q in zip(one.value_head.state_dict().items(), two.value_head.state_dict().values(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5, msg=k)


def _exported(tr: Trainer) -> dict[str, torch.Tensor]:
    return {
        t.name: torch.frombuffer(bytearray(t.data), dtype=torch.float32).reshape(t.shape) for t in tr.export_weights()
    }


def _assert_weights_close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5, msg=k)


@pytest.mark.slow
def test_fsdp_ranks_hold_shards_train_like_one_rank_and_share_its_checkpoints(model_dir: Path, tmp_path: Path) -> None:
    from torch.distributed.tensor import DTensor
    from transformers import AutoModelForCausalLM

    fsdp = ("learner.dp_size=2", 'learner.dp_mode="fsdp"')
    one = Trainer.load(make_cfg(model_dir, *COMMON))
    m_one = _steps(one, 2)
    one.save(tmp_path / "one" / "step_000002", {})

    two = Trainer.load(make_cfg(model_dir, *COMMON, *fsdp))
    try:
        assert two.fsdp and dist.get_world_size() == 2
        # rank 0 holds the first half (rounded up) of every weight, and of its AdamW moments
        emb = two.model.get_input_embeddings().weight
        assert isinstance(emb, DTensor) and emb.to_local().shape[0] == (emb.shape[0] + 1) // 2 < emb.shape[0]
        m_two = _steps(two, 2)
        assert all(isinstance(v, DTensor) for st in two.optimizer.state.values() for k, v in st.items() if k != "step")
        after_two = _exported(two)
        # the names the sharded policy trains are the names its export gives (the exporter
        # takes them as changed without hashing: learner/training/weight_export.py)
        assert set(after_two) <= two.trained_names() and two.trained_names() == one.trained_names()
        two.save(tmp_path / "two" / "step_000002", {"seen": ["g0"]})
        # a checkpoint of one replicated rank resumes the sharded pair
        assert two.load_checkpoint(tmp_path / "one" / "step_000002") == {}
        assert two.step == two.version == 2
        m_two3 = _steps(two, 1)[0]
        after_two3 = _exported(two)
    finally:
        two.close()
    assert not dist.is_initialized()
    assert two.dp.procs is not None and all(p.exitcode == 0 for p in two.dp.procs)

    for a, b in zip(m_one, m_two, strict=True):
        assert (a["trained_tokens"], a["optimizer_steps"], a["micro_batches"]) == (
            b["trained_tokens"],
            b["optimizer_steps"],
            b["micro_batches"],
        )
        for k in METRICS:
            assert a[k] == pytest.approx(b[k], rel=1e-4, abs=1e-6), k
    _assert_weights_close(_exported(one), after_two)
    # the sharded pair's checkpoint: a model transformers loads, and a one-rank trainer resumes
    # from it (weights, value head, AdamW moments) and takes the step the pair takes
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "two" / "step_000002")
    _assert_weights_close(dict(hf.state_dict()), after_two)
    resumed = Trainer.load(make_cfg(model_dir, *COMMON))
    assert resumed.load_checkpoint(tmp_path / "two" / "step_000002") == {"seen": ["g0"]}
    assert resumed.value_head is not None and one.value_head is not None
    torch.testing.assert_close(resumed.value_head.linear.weight, one.value_head.linear.weight, rtol=1e-4, atol=1e-5)
    m_one3, m_res3 = _steps(one, 1)[0], _steps(resumed, 1)[0]
    for k in METRICS:
        assert m_one3[k] == pytest.approx(m_res3[k], rel=1e-4, abs=1e-6), k
        assert m_one3[k] == pytest.approx(m_two3[k], rel=1e-4, abs=1e-6), k
    _assert_weights_close(_exported(one), _exported(resumed))
    _assert_weights_close(_exported(one), after_two3)


@pytest.mark.slow
def test_fsdp_ranks_with_a_reference_model_and_no_value_head_train_like_one_rank(model_dir: Path) -> None:
    # GRPO with the KL to the reference as a loss term: the no-grad pass runs the sharded
    # reference only (no proximal pass with one minibatch), and the rank with fewer micro-batches
    # (one group of 3 rows: 2 on one rank, 1 on the other) must run exactly those forwards idle.
    cfg = (
        "learner.algorithm=grpo",
        "learner.kl_coef=0.1",
        'learner.kl_mode="loss"',
        'learner.kl_estimator="k3"',
        "learner.micro_batch_tokens=16",
        "learner.lr=3e-3",
        "learner.dist_timeout_s=120",
    )
    one = Trainer.load(make_cfg(model_dir, *cfg))
    m_one = [one.train_step(bandit_rollouts(version=one.version, group_size=3)[:1]) for _ in range(2)]
    two = Trainer.load(make_cfg(model_dir, *cfg, "learner.dp_size=2", 'learner.dp_mode="fsdp"'))
    try:
        m_two = [two.train_step(bandit_rollouts(version=two.version, group_size=3)[:1]) for _ in range(2)]
        after_two = _exported(two)
    finally:
        two.close()
    for a, b in zip(m_one, m_two, strict=True):
        assert a["micro_batches"] == b["micro_batches"] == 3.0
        for k in ("loss", "pg_loss", "kl_ref", "entropy", "grad_norm", "is_weight_mean"):
            assert a[k] == pytest.approx(b[k], rel=1e-4, abs=1e-6), k
    _assert_weights_close(_exported(one), after_two)
    assert m_two[1]["kl_ref"] > 0  # the policy has moved off the reference: the KL term is live
