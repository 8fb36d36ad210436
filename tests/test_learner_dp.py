"""Data-parallel learner: 2 real gloo ranks (two processes over torch.distributed) take the same
optimizer steps as 1 rank on the same global batch."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from learner_fixtures import bandit_rollouts, make_cfg

from agentgym.learner.trainer import Trainer
from agentgym.tiny_model import FALLBACK_CORPUS, make_tiny_model

# Every path that crosses ranks: the no-grad pass (π_prox, values, π_ref summed over ranks),
# several minibatches, gradient accumulation, the value head, KL and entropy terms, and an
# uneven split (3 rows per minibatch over 2 ranks: one rank gets 2 rows, the other 1).
COMMON = ("learner.algorithm=ppo", "learner.minibatches=2", "learner.micro_batch_tokens=16", "learner.kl_coef=0.05",
          "learner.entropy_coef=0.01", "learner.lr=3e-3", "learner.dist_timeout_s=300")  # fmt: skip
METRICS = ("loss", "pg_loss", "value_loss", "kl_ref", "entropy", "grad_norm", "clip_frac", "approx_kl",
           "is_weight_mean", "explained_variance")  # fmt: skip


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
