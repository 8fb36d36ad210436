"""The Trainer on fixed synthetic batches (no actors): each algorithm's sign, the on-policy
equality, staleness weights, gradient accumulation, exact resume and checkpoint files."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from learner_fixtures import BAD, GOOD, PROMPTS, bandit_rollouts, episode, good_logprob, make_cfg, params_equal

from agentgym.learner.algorithms.advantages import broadcast_sequence_advantages, grpo_advantages
from agentgym.learner.model.logprobs import sequence_logprobs
from agentgym.learner.training.batch import collate
from agentgym.learner.training.checkpoint import latest_checkpoint
from agentgym.learner.training.trainer import Trainer
from agentgym.models.tiny import FALLBACK_CORPUS, make_tiny_model
from agentgym.protocol import Rollout
from agentgym.protocol.arrays import F32, I32, U8, pack, unpack


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("trainer") / "m", corpus=FALLBACK_CORPUS, seed=0)


@pytest.mark.parametrize("algorithm", ["grpo", "ppo", "reinforce_pp", "rloo"])
def test_each_algorithm_raises_the_rewarded_tokens_probability(model_dir: Path, algorithm: str) -> None:
    tr = Trainer.load(make_cfg(model_dir, f"learner.algorithm={algorithm}"))
    before = [(good_logprob(tr.model, p, GOOD), good_logprob(tr.model, p, BAD)) for p in PROMPTS]
    for _ in range(3):
        m = tr.train_step(bandit_rollouts(tr.model, version=tr.version))
    after = [(good_logprob(tr.model, p, GOOD), good_logprob(tr.model, p, BAD)) for p in PROMPTS]
    for (g0, b0), (g1, b1) in zip(before, after, strict=True):
        assert g1 > g0 + 0.5 and b1 < b0, (algorithm, before, after)
    assert m["optimizer_steps"] == 1 and m["trained_tokens"] == 8 and m["grad_norm"] > 0
    assert ("value_loss" in m) == (algorithm == "ppo")


def _own_behaviour(tr: Trainer, rollouts: list[Rollout]) -> list[Rollout]:
    """The same rollouts with behaviour logprobs bit-equal to the learner's own (zero staleness,
    identical numerics): computed on the collated batch exactly as the trainer computes them."""
    b = collate(rollouts, tr.pad_id)
    with torch.no_grad():
        logp = sequence_logprobs(tr.model, b.input_ids, b.attention_mask, 1.0)
    out, row = [], 0
    for r in rollouts:
        eps = []
        for e in r.episodes:
            agent = b.loss_mask[row] != 0
            toks = [[int(t)] for t in b.input_ids[row][agent]]
            prompt = b.input_ids[row, : int(agent.nonzero()[0])].tolist()
            eps.append(episode(prompt, toks, [e.reward], version=tr.version, behav=logp[row][agent].tolist()))
            row += 1
        out.append(Rollout(group_id=r.group_id, actor_id="a", env="bandit", task_id=r.task_id, episodes=eps))
    return out


def test_zero_staleness_corrected_step_equals_the_on_policy_step_exactly(model_dir: Path) -> None:
    """TIS cap, rejection and down-weighting switched on; with π_prox = μ bit for bit and no
    staleness they must change nothing: the weights equal a hand-written REINFORCE step's."""
    cfg = make_cfg(
        model_dir,
        "learner.tis_cap=2.0",
        "learner.tis_reject_above=3.0",
        "learner.staleness_mode=downweight",
        "learner.max_staleness=0",
        "learner.adam_eps=1e-4",  # not torch's default: the step must use it
        "learner.shared_prefix=false",
    )  # bit for bit: the unpacked forward on both sides
    tr = Trainer.load(cfg)
    ref = copy.deepcopy(tr.model)
    rollouts = _own_behaviour(tr, bandit_rollouts())
    m = tr.train_step(rollouts)
    assert m["is_weight_mean"] == 1.0 and m["is_weight_max"] == 1.0 and m["is_truncated_frac"] == 0.0
    assert m["clip_frac"] == 0.0 and m["approx_kl"] == 0.0 and m["staleness_weight_mean"] == 1.0

    b = collate(rollouts, tr.pad_id)
    opt = torch.optim.AdamW(ref.parameters(), lr=cfg.learner.lr, weight_decay=cfg.learner.weight_decay, eps=1e-4)
    adv = broadcast_sequence_advantages(grpo_advantages(b.rewards, b.group_index), b.loss_mask)
    logp = sequence_logprobs(ref, b.input_ids, b.attention_mask, 1.0)
    loss = -(adv * logp * b.loss_mask).sum() / b.loss_mask.sum()  # the on-policy policy gradient
    loss.backward()
    torch.nn.utils.clip_grad_norm_(ref.parameters(), cfg.learner.max_grad_norm)
    opt.step()
    # The corrected loss is a surrogate with r = π_θ/sg(π_θ) = 1: its value is −mean(A) (not
    # −mean(A·log π)), its gradient −A·∇log π, the same as the on-policy loss's bit for bit.
    assert m["loss"] == pytest.approx(float(-(adv * b.loss_mask).sum() / b.loss_mask.sum()), abs=1e-7)
    assert params_equal(tr.model, ref)


@pytest.mark.parametrize("mode", ["downweight", "drop"])
def test_stale_tokens_are_weighted_per_token(model_dir: Path, mode: str) -> None:
    cfg = make_cfg(
        model_dir,
        f"learner.staleness_mode={mode}",
        "learner.max_staleness=1",
        "learner.staleness_decay=0.5",
        "learner.std_normalize=false",
        "learner.tis_cap=2.0",
        "learner.importance_baseline=false",
    )
    tr = Trainer.load(cfg)
    tr.step = 3
    prompt = PROMPTS[0]
    # rewards 1, 1, 0, 0 -> A = +0.5, +0.5, -0.5, -0.5 (no std); versions 3, 3, 0, 0 -> staleness 0, 0, 3, 3
    eps = [
        episode(prompt, [[t]], [r], version=v)
        for t, r, v in ((GOOD, 1.0, 3), (GOOD, 1.0, 3), (BAD, 0.0, 0), (BAD, 0.0, 0))
    ]
    rollouts = _own_behaviour(tr, [Rollout(group_id="g", actor_id="a", env="e", task_id=0, episodes=eps)])
    # _own_behaviour stamps every token with the current version: put the stale ones back
    for e in rollouts[0].episodes[2:]:
        e.versions = pack(np.where(unpack(e.loss_mask, U8) == 1, 0, -1), I32)
    m = tr.train_step(rollouts)
    # r = 1, w_behav = 1: per-token loss −A·weight; weights 1, 1, s, s with s = 0.5^(3−1) (downweight) or 0 (drop)
    s = 0.25 if mode == "downweight" else 0.0
    n = 4 if mode == "downweight" else 2  # tokens with a nonzero weight count in the normaliser
    assert m["pg_loss"] == pytest.approx((-0.5 - 0.5 + s * 0.5 + s * 0.5) / n, abs=1e-6)
    assert m["staleness_weight_mean"] == pytest.approx((2 + 2 * s) / 4)
    assert m["trained_tokens"] == n and m["staleness_frac_0"] == 0.5 and m["staleness_frac_gt1"] == 0.5
    assert m["staleness_max"] == 3.0


@pytest.mark.parametrize("on", [True, False])
def test_stale_groups_are_recentred_on_the_importance_weighted_baseline(model_dir: Path, on: bool) -> None:
    """A group sampled two versions ago whose rewarded answer has grown since (μ gave it less
    than π_prox does): with learner.importance_baseline the weighted advantages sum to 0, so at
    r = 1 the policy loss is 0 (no net push on the sampled tokens); without, the push is upwards."""
    cfg = make_cfg(
        model_dir,
        "learner.std_normalize=false",
        "learner.tis_cap=2.0",
        f"learner.importance_baseline={str(on).lower()}",
    )
    tr = Trainer.load(cfg)
    tr.step = 2
    eps = [episode(PROMPTS[0], [[t]], [r], version=0) for t, r in ((GOOD, 1.0), (BAD, 0.0), (BAD, 0.0), (BAD, 0.0))]
    rollouts = _own_behaviour(tr, [Rollout(group_id="g", actor_id="a", env="e", task_id=0, episodes=eps)])
    for e, shift in zip(rollouts[0].episodes, (math.log(1.5), 0.0, 0.0, math.log(0.5)), strict=True):
        agent = unpack(e.loss_mask, U8) == 1
        e.versions = pack(np.where(agent, 0, -1), I32)  # stale: sampled at version 0, trained at 2
        e.logprobs = pack(unpack(e.logprobs, F32) - np.float32(shift), F32)  # π_prox/μ = 1.5, 1, 1, 0.5
    m = tr.train_step(rollouts)
    # A = 0.75, -0.25 x 3; w = 1.5, 1, 1, 0.5: Σ w·A = 1.125 - 0.625 = 0.5 over 4 tokens
    assert m["pg_loss"] == pytest.approx(0.0 if on else -0.5 / 4, abs=1e-5)
    assert m["is_weight_mean"] == pytest.approx(1.0, abs=1e-5)


def _run(cfg, steps: int, model_dir: Path) -> tuple[Trainer, list[dict[str, float]]]:
    tr = Trainer.load(cfg)
    return tr, [tr.train_step(bandit_rollouts(version=tr.version)) for _ in range(steps)]


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_micro_batches_add_up_to_one_pass(model_dir: Path, agg: str) -> None:
    common = (
        "learner.algorithm=ppo",
        "learner.kl_coef=0.1",
        "learner.entropy_coef=0.01",
        "learner.lr=1e-3",
        f"learner.loss_agg={agg}",
        "learner.minibatches=2",
    )
    one, m1 = _run(make_cfg(model_dir, *common), 2, model_dir)
    acc, m2 = _run(make_cfg(model_dir, *common, "learner.micro_batch_tokens=12"), 2, model_dir)
    # each minibatch is one group of equally long rows (11 and 13 tokens): the budget of 12 puts every row alone
    assert (m1[0]["micro_batches"], m2[0]["micro_batches"]) == (2.0, 8.0)
    for a, b in zip(m1, m2, strict=True):
        for k in ("loss", "pg_loss", "value_loss", "kl_ref", "entropy", "grad_norm", "clip_frac"):
            assert a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-7), k
    # Adam divides each gradient element by its own running size, so where an element is near
    # eps, float rounding in how the sum was split moves that weight by up to a fraction of lr
    # (1e-3); measured up to 9.4e-7 on three model seeds. A real accumulation error (a micro-batch
    # mis-weighted) moves whole tensors by about lr, and the metrics above check scale exactly.
    for (k, p), q in zip(one.model.state_dict().items(), acc.model.state_dict().values(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-5, msg=k)


def test_epochs_pass_over_the_batch_again_against_the_batch_start(model_dir: Path) -> None:
    """``learner.epochs = 2``: two passes over the same batch, the second with a ratio
    pi_theta/pi_prox away from 1 (the proximal policy is the batch start's, not the moving one),
    the version moving by one; the first pass is exactly the one-epoch step."""
    common = ("learner.lr=1e-2", "learner.clip_low=0.01", "learner.clip_high=0.01")
    one = Trainer.load(make_cfg(model_dir, *common))
    two = Trainer.load(make_cfg(model_dir, *common, "learner.epochs=2"))
    rollouts = bandit_rollouts(version=0)
    m1, m2 = one.train_step(rollouts), two.train_step(rollouts)
    # the first pass moves every token's ratio past the 0.01 clip, so the second one's gradient is
    # exactly zero and it makes no update (a zero gradient leaves the weights alone)
    assert (m1["optimizer_steps"], m2["optimizer_steps"], m2["clip_frac"]) == (1.0, 1.0, 0.5)
    assert one.version == two.version == 1
    assert m1["approx_kl"] == 0.0 and m1["clip_frac"] == 0.0
    assert m2["approx_kl"] > 0 and m2["clip_frac"] > 0  # the second pass sees the first one's move
    assert m2["trained_tokens"] == 2 * m1["trained_tokens"]
    # one more step of the one-epoch trainer on the same batch is not the same: its proximal
    # policy would be the moved one (ratio 1 again, no clip)
    m1b = one.train_step(rollouts)
    assert m1b["clip_frac"] == 0.0
    assert not params_equal(one.model, two.model)


RESUME = (
    "learner.algorithm=ppo",
    "learner.kl_coef=0.05",
    "learner.entropy_coef=0.01",
    "learner.minibatches=2",
    "learner.micro_batch_tokens=24",
    "learner.warmup_steps=2",
    "learner.lr_schedule=cosine",
    "learner.staleness_mode=downweight",
    "learner.keep_checkpoints=2",
    "run.max_steps=4",
)


def test_resume_is_bit_exact(model_dir: Path, tmp_path: Path) -> None:
    """4 steps == 2 steps + save + a fresh Trainer + load + 2 steps: same losses, same weights."""
    cfg = make_cfg(model_dir, *RESUME)
    straight, m_straight = _run(cfg, 4, model_dir)

    first, m_first = _run(cfg, 2, model_dir)
    ckpt = tmp_path / "checkpoints" / "step_000002"
    first.save(ckpt, {"seen": ["g0", "g1"], "issued": 16})
    second = Trainer.load(cfg)
    assert second.load_checkpoint(ckpt) == {"seen": ["g0", "g1"], "issued": 16}
    assert (second.step, second.version) == (2, 2)
    m_second = [second.train_step(bandit_rollouts(version=second.version)) for _ in range(2)]

    drop = lambda ms: [{k: v for k, v in m.items() if k != "train_time_s"} for m in ms]  # noqa: E731
    assert drop(m_first + m_second) == drop(m_straight)
    assert params_equal(second.model, straight.model)
    assert second.value_head is not None and straight.value_head is not None
    assert params_equal(second.value_head, straight.value_head)
    assert m_straight[0]["lr"] == pytest.approx(0.5e-2) and m_straight[3]["lr"] < m_straight[2]["lr"]


def test_checkpoint_is_an_hf_model_directory_and_old_ones_are_pruned(model_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tr, _ = _run(make_cfg(model_dir, *RESUME), 1, model_dir)
    ckpts = tmp_path / "checkpoints"
    (ckpts / "step_000009.tmp").mkdir(parents=True)  # a save that crashed: never "latest", never pruned
    for step in (1, 2, 3):
        tr.save(ckpts / f"step_{step:06d}", {})
    assert sorted(p.name for p in ckpts.iterdir()) == ["step_000002", "step_000003", "step_000009.tmp"]
    assert latest_checkpoint(ckpts) == ckpts / "step_000003"
    d = ckpts / "step_000003"
    assert [p.name for p in d.glob("*.safetensors")] == ["model.safetensors"]  # vLLM loads every one of them
    hf = AutoModelForCausalLM.from_pretrained(d)
    assert params_equal(hf, tr.model)
    tok = AutoTokenizer.from_pretrained(d)
    assert tok.decode(tok.encode("higher")) == "higher"
    grpo = Trainer.load(make_cfg(model_dir))
    with pytest.raises(ValueError, match="written with learner.algorithm = 'ppo'"):
        grpo.load_checkpoint(d)
    with pytest.raises(FileNotFoundError, match="not a learner checkpoint"):
        grpo.load_checkpoint(model_dir)


def test_bf16_autocast_runs_the_model_in_bfloat16_and_keeps_float32_state(model_dir: Path) -> None:
    # The path GPUs take, run on the CPU: forward passes in bfloat16, weights, gradients, AdamW
    # state and logprobs in float32; the step points where the float32 step points.
    fp32 = Trainer.load(make_cfg(model_dir, "learner.lr=1e-3", "learner.entropy_coef=0.01"))
    bf16 = Trainer.load(
        make_cfg(model_dir, "learner.lr=1e-3", "learner.entropy_coef=0.01", "learner.bf16_autocast=true")
    )
    ids = torch.tensor([PROMPTS[0]])
    with torch.no_grad():
        with bf16._autocast():
            assert bf16.model(input_ids=ids).logits.dtype == torch.bfloat16
            lp16 = sequence_logprobs(bf16.model, ids, torch.ones_like(ids))
        lp32 = sequence_logprobs(fp32.model, ids, torch.ones_like(ids))
    assert lp16.dtype == torch.float32
    diff = float((lp16 - lp32).abs().max())
    assert 0 < diff < 0.1, diff  # bfloat16 arithmetic, not float32's, and close to it

    before = torch.cat([p.detach().reshape(-1).clone() for p in fp32.params])
    rollouts = bandit_rollouts(fp32.model)
    m32, m16 = fp32.train_step(rollouts), bf16.train_step(rollouts)
    assert all(p.dtype == torch.float32 for p in bf16.params)
    assert all(v.dtype == torch.float32 for st in bf16.optimizer.state.values() for v in st.values() if v.ndim > 0)
    assert m16["entropy"] != m32["entropy"] and m16["entropy"] == pytest.approx(m32["entropy"], rel=0.02)
    assert m16["trained_tokens"] == m32["trained_tokens"] == 8 and m16["grad_norm"] > 0
    d32 = torch.cat([p.detach().reshape(-1) for p in fp32.params]) - before
    d16 = torch.cat([p.detach().reshape(-1) for p in bf16.params]) - before
    cos = float(torch.nn.functional.cosine_similarity(d32, d16, dim=0))
    assert cos > 0.9, cos


@pytest.mark.parametrize("truncation", ["bootstrap", "terminal"])
def test_ppo_turn_limit_cut_is_bootstrapped_or_terminal_by_config(model_dir: Path, truncation: str) -> None:
    # The same episodes, once cut by the turn limit and once ended: with truncation = terminal
    # PPO takes the same step on both; with bootstrap the cut ones add V(s_end) to their return.
    def rollouts(finish: str) -> list[Rollout]:
        out = []
        for gi, prompt in enumerate(PROMPTS):
            eps = [
                episode(prompt, [[GOOD if i % 2 == 0 else BAD]], [float(i % 2 == 0)], finish=finish) for i in range(4)
            ]
            out.append(Rollout(group_id=f"g{gi}", actor_id="a", env="bandit", task_id=gi, episodes=eps))
        return out

    cfg = make_cfg(model_dir, "learner.algorithm=ppo", f'learner.truncation="{truncation}"')
    cut, ended = Trainer.load(cfg), Trainer.load(cfg)
    for _ in range(2):  # the value head starts at V = 0: the second step sees V(s_end) != 0
        m_cut, m_ended = cut.train_step(rollouts("turn_limit")), ended.train_step(rollouts("done"))
    assert m_cut["truncated_frac"] == 1.0 and m_ended["truncated_frac"] == 0.0
    if truncation == "terminal":
        assert params_equal(cut.model, ended.model) and m_cut["value_loss"] == m_ended["value_loss"]
    else:
        assert not params_equal(cut.model, ended.model) and m_cut["value_loss"] != m_ended["value_loss"]


def test_the_value_head_learns_at_its_own_rate_on_the_same_schedule(model_dir: Path) -> None:
    cfg = make_cfg(
        model_dir,
        "learner.algorithm=ppo",
        "learner.lr=1e-3",
        "learner.value_lr=1e-2",
        "learner.warmup_steps=2",
        "run.max_steps=10",
    )
    tr = Trainer.load(cfg)
    head = {id(p) for p in tr.value_head.parameters()}
    policy_group, head_group = tr.optimizer.param_groups
    assert {id(p) for p in head_group["params"]} == head and not head & {id(p) for p in policy_group["params"]}
    m = tr.train_step(bandit_rollouts(tr.model, version=tr.version))
    assert m["lr"] == pytest.approx(0.5e-3)  # warm-up step 1 of 2
    assert (policy_group["lr"], head_group["lr"]) == (pytest.approx(0.5e-3), pytest.approx(0.5e-2))
    # Without value_lr the head follows the policy's rate.
    same = Trainer.load(make_cfg(model_dir, "learner.algorithm=ppo", "learner.lr=1e-3"))
    same.train_step(bandit_rollouts(same.model, version=same.version))
    assert [g["lr"] for g in same.optimizer.param_groups] == [pytest.approx(1e-3)] * 2


def test_a_batch_without_gradient_leaves_the_weights_alone(model_dir: Path) -> None:
    """After a real step Adam has momentum; a batch whose every group got one reward (all
    advantages 0, no KL or entropy term) has an exactly zero gradient, and the step leaves the
    weights as they were (Adam's moments and count advance, at lr 0). torch's AdamW at the step's
    lr would go on moving every weight by that momentum (checked at the end), which on a
    sparse-reward env turned a base model that answered into one that never does within 6 steps
    of zero signal."""
    tr = Trainer.load(make_cfg(model_dir, "learner.lr=3e-3"))
    tr.train_step(bandit_rollouts(tr.model, version=tr.version))
    weights, adam = copy.deepcopy(tr.model.state_dict()), copy.deepcopy(tr.optimizer.state_dict())
    flat = [
        Rollout(
            group_id=f"f{gi}",
            actor_id="a",
            env="bandit",
            task_id=gi,
            episodes=[episode(p, [[tok]], [1.0], version=tr.version) for tok in (GOOD, BAD, GOOD, BAD)],
        )
        for gi, p in enumerate(PROMPTS)
    ]
    m = tr.train_step(flat)
    assert (m["grad_norm"], m["optimizer_steps"], m["trained_tokens"]) == (0.0, 0.0, 8.0)
    assert tr.version == 2  # a learner step all the same: the version counts steps, not updates
    for k, v in tr.model.state_dict().items():
        assert torch.equal(v, weights[k]), k
    after = tr.optimizer.state_dict()["state"]
    assert all(float(s["step"]) == float(adam["state"][i]["step"]) + 1 for i, s in after.items())
    for g in tr.optimizer.param_groups:  # the next step runs at the schedule's lr again
        g["lr"] = 3e-3
    for p in tr.model.parameters():  # what the rule prevents: the same zero gradient, stepped
        p.grad = torch.zeros_like(p)
    tr.optimizer.step()
    assert not all(torch.equal(v, weights[k]) for k, v in tr.model.state_dict().items())


def test_negative_advantage_scale_zero_trains_only_what_beat_its_baseline(model_dir: Path) -> None:
    """learner.negative_advantage_scale = 0: tokens below their baseline get no gradient. Each
    group answers BAD four times with rewards (0, 0, -1, -1): two advantages above the mean, two
    below, on the same token after the same prompt. Two-sided, they cancel (no gradient);
    with 0, only the two above the mean are trained and BAD's probability rises."""

    def batch() -> list[Rollout]:
        return [
            Rollout(
                group_id=f"n{gi}",
                actor_id="a",
                env="bandit",
                task_id=gi,
                episodes=[episode(p, [[BAD]], [r], version=0) for r in (0.0, 0.0, -1.0, -1.0)],
            )
            for gi, p in enumerate(PROMPTS)
        ]

    two_sided = Trainer.load(make_cfg(model_dir))
    before = [good_logprob(two_sided.model, p, BAD) for p in PROMPTS]
    assert two_sided.train_step(batch())["grad_norm"] < 1e-6  # float residue of an exact cancellation
    up_only = Trainer.load(make_cfg(model_dir, "learner.negative_advantage_scale=0"))
    m = up_only.train_step(batch())
    assert m["grad_norm"] > 1e-2 and m["optimizer_steps"] == 1
    after = [good_logprob(up_only.model, p, BAD) for p in PROMPTS]
    assert all(a > b + 0.1 for a, b in zip(after, before, strict=True)), (before, after)


def test_a_groups_shared_prefix_packed_gives_the_unpacked_step(model_dir: Path) -> None:
    """learner.shared_prefix: the groups' prompts run once, and the step is the unpacked one's up
    to float rounding (the same logprobs, the same gradient); the forward ran fewer tokens."""
    steps = {}
    for packed in (True, False):
        tr = Trainer.load(make_cfg(model_dir, f"learner.shared_prefix={str(packed).lower()}", "learner.kl_coef=0.01"))
        m = tr.train_step(bandit_rollouts(tr.model, version=tr.version, group_size=6))
        steps[packed] = (m, [p.detach().clone() for p in tr.model.parameters()])
    (mp, wp), (mu, wu) = steps[True], steps[False]
    assert mp["forward_tokens"] < mu["forward_tokens"] == mu["tokens"]
    assert mp["trained_tokens"] == mu["trained_tokens"]
    for key in ("loss", "grad_norm", "kl_ref", "entropy"):
        assert mp[key] == pytest.approx(mu[key], rel=1e-4, abs=1e-6), key
    # AdamW's first step moves every weight by about lr (1e-2) whatever its gradient's size, so
    # rounding in a near-zero gradient shows up at that scale: within 1% of one step.
    assert max(float((a - b).abs().max()) for a, b in zip(wp, wu, strict=True)) < 1e-4


@pytest.mark.parametrize("param_dtype", ["float32", "model"])
def test_a_bfloat16_model_trains_float32_master_weights_by_default(model_dir: Path, param_dtype: str) -> None:
    # model.dtype bfloat16 is the engines' and the wire's dtype; the learner keeps float32 master
    # weights and runs the passes under bfloat16 autocast (learner.param_dtype = "float32"), or
    # holds bfloat16 throughout when asked ("model").
    tr = Trainer.load(
        make_cfg(model_dir, 'model.dtype="bfloat16"', f'learner.param_dtype="{param_dtype}"', "learner.lr=1e-3")
    )
    want = torch.float32 if param_dtype == "float32" else torch.bfloat16
    assert {p.dtype for p in tr.params} == {want}
    assert tr.compute_dtype == (torch.bfloat16 if param_dtype == "float32" else None)
    head_out: list[torch.dtype] = []
    hook = tr.model.get_output_embeddings().register_forward_hook(lambda _m, _a, out: head_out.append(out.dtype))
    m = tr.train_step(bandit_rollouts(tr.model))
    hook.remove()
    assert m["trained_tokens"] == 8 and m["grad_norm"] > 0
    # The LM head reads the needed rows in the weights' dtype, outside autocast.
    assert head_out and set(head_out) == {want}
    assert {t.dtype for t in tr.export_weights("bfloat16")} == {"bfloat16"}
