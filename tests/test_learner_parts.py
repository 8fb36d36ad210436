"""learner/training/batch.py, algorithms.py, policy.py, checkpoint.py: hand-computed values and properties."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from learner_fixtures import BAD, GOOD, episode

from agentgym.learner.algorithms.estimators import bootstrap_values, compute_advantages, explained_variance, lr_factor
from agentgym.learner.algorithms.losses import aggregate
from agentgym.learner.model.policy import ValueHead, forward_tokens
from agentgym.learner.training.batch import collate, credit_rewards, micro_batches, shard_rows
from agentgym.learner.training.checkpoint import rng_state, set_rng_state
from agentgym.protocol import Rollout


def test_turn_rewards_go_on_each_turns_last_agent_token_and_the_rest_on_the_last() -> None:
    # tokens: 0 1 | 2 3 (turn 0) | 4 (env) | 5 6 (turn 1) | 7 (env); exclusive turn ends 4 and 7
    mask = np.array([0, 0, 1, 1, 0, 1, 1, 0], dtype=np.float32)
    out = credit_rewards(mask, np.array([4, 7]), np.array([0.5, -1.0], dtype=np.float32), reward=-0.5)
    assert out.tolist() == [0, 0, 0, 0.5, 0, 0, -1.0, 0]
    # an episode reward the turn rewards do not account for goes on the last agent token
    out = credit_rewards(mask, np.array([4, 7]), np.array([0.5, 0.0], dtype=np.float32), reward=2.0)
    assert out.tolist() == [0, 0, 0, 0.5, 0, 0, 1.5, 0]
    # no turn rewards at all (outcome only): everything on the last agent token
    assert credit_rewards(mask, np.zeros(0), np.zeros(0, dtype=np.float32), reward=1.0).tolist() == [
        0,
        0,
        0,
        0,
        0,
        0,
        1.0,
        0,
    ]
    # a turn without agent tokens passes its reward on to the next turn
    out = credit_rewards(mask, np.array([1, 4, 7]), np.array([3.0, 0.5, 0.0], dtype=np.float32), reward=3.5)
    assert out.tolist() == [0, 0, 0, 3.5, 0, 0, 0, 0]
    # no agent token: nothing to credit
    assert not credit_rewards(np.zeros(3, dtype=np.float32), np.zeros(0), np.zeros(0, dtype=np.float32), 1.0).any()


@given(
    st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2), st.floats(-5, 5, width=32)), min_size=1, max_size=6),
    st.integers(0, 4),
)
@settings(max_examples=80, deadline=None)
def test_credited_rewards_sit_on_agent_tokens_and_sum_to_the_episode_reward(turns, prompt_len) -> None:
    """Every turn: n agent tokens then m environment tokens, reward r."""
    mask, ends, rs = [0] * prompt_len, [], []
    for n, m, r in turns:
        mask += [1] * n
        ends.append(len(mask))
        mask += [0] * m
        rs.append(r)
    mask_a = np.array(mask, dtype=np.float32)
    rs_a = np.array(rs, dtype=np.float32)
    out = credit_rewards(mask_a, np.array(ends), rs_a, float(rs_a.astype(np.float64).sum()))
    assert not out[mask_a == 0].any()
    if mask_a.any():
        assert out.sum() == pytest.approx(float(rs_a.sum()), abs=1e-4)


def test_collate_pads_right_and_keeps_behaviour_versions_and_credit() -> None:
    e0 = episode([1, 2, 3], [[GOOD], [BAD, GOOD]], [0.0, 1.0], version=3, behav=[-0.1, -0.2, -0.3], finish="turn_limit")
    e1 = episode([1, 2], [[BAD]], [0.0], version=2, behav=[-0.5])
    b = collate([Rollout(group_id="g", actor_id="a", env="e", task_id=0, episodes=[e0, e1])], pad_id=0)
    # e0: 1 2 3 G | 2 10 | B G | 2 10  (10 tokens); e1: 1 2 B | 2 10 (5 tokens)
    assert b.lengths.tolist() == [10, 5] and b.attention_mask.sum(-1).tolist() == [10, 5]
    assert b.loss_mask[0].tolist() == [0, 0, 0, 1, 0, 0, 1, 1, 0, 0]
    assert b.versions[0].tolist() == [-1, -1, -1, 3, -1, -1, 3, 3, -1, -1]
    assert b.behav_logp[0, [3, 6, 7]].tolist() == pytest.approx([-0.1, -0.2, -0.3])
    assert b.token_rewards[0].tolist() == [0, 0, 0, 0, 0, 0, 0, 1.0, 0, 0]
    assert b.input_ids[1, 5:].tolist() == [0] * 5 and b.loss_mask[1, 5:].sum() == 0
    assert b.truncated.tolist() == [1.0, 0.0] and b.turns.tolist() == [2.0, 1.0]
    # A token-budget cut is terminal (nothing can follow within the budget): no bootstrap.
    e2 = episode([1, 2], [[BAD]], [0.0], finish="token_limit")
    assert collate(
        [Rollout(group_id="h", actor_id="a", env="e", task_id=0, episodes=[e2])], pad_id=0
    ).truncated.tolist() == [0.0]


@given(st.lists(st.integers(1, 40), min_size=0, max_size=30), st.integers(1, 100))
@settings(max_examples=100, deadline=None)
def test_micro_batches_partition_rows_in_order_within_the_budget(lens: list[int], budget: int) -> None:
    lengths = torch.tensor(lens, dtype=torch.long)
    rows = torch.arange(len(lens))
    mbs = micro_batches(rows, lengths, budget)
    assert (torch.cat(mbs).tolist() if mbs else []) == rows.tolist()
    for mb in mbs:
        assert mb.numel() == 1 or int(lengths[mb].max()) * mb.numel() <= budget
    assert micro_batches(rows, lengths, None) == ([rows] if lens else [])


@given(st.lists(st.integers(1, 40), min_size=0, max_size=30), st.integers(1, 5))
@settings(max_examples=100, deadline=None)
def test_shard_rows_gives_every_row_to_exactly_one_rank(lens: list[int], world: int) -> None:
    lengths = torch.tensor(lens, dtype=torch.long)
    rows = torch.arange(len(lens))
    shards = [shard_rows(rows, lengths, r, world) for r in range(world)]
    assert sorted(torch.cat(shards).tolist()) == rows.tolist()
    assert all(s.tolist() == sorted(s.tolist()) for s in shards)
    sizes = [s.numel() for s in shards]
    assert max(sizes) - min(sizes) <= 1


def test_lr_factor_by_hand() -> None:
    def f(s, sched, **kw):
        return lr_factor(s, warmup_steps=kw.get("w", 4), total_steps=12, schedule=sched, min_ratio=kw.get("m", 0.0))

    assert [f(s, "constant") for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    # after warm-up, progress p = (s - 4) / 8
    assert f(8, "linear") == pytest.approx(0.5) and f(12, "linear") == 0.0 and f(50, "linear") == 0.0
    assert f(8, "linear", m=0.2) == pytest.approx(0.6)
    assert (
        f(4, "cosine") == 1.0 and f(8, "cosine") == pytest.approx(0.5) and f(12, "cosine", m=0.1) == pytest.approx(0.1)
    )
    assert f(6, "cosine") == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)))
    assert f(0, "constant", w=0) == 1.0


def test_explained_variance_by_hand() -> None:
    mask = torch.tensor([1.0, 1.0, 1.0, 0.0])
    ret = torch.tensor([1.0, 2.0, 3.0, 100.0])
    assert explained_variance(ret, ret, mask) == 1.0
    assert explained_variance(torch.full((4,), 2.0), ret, mask) == pytest.approx(0.0)
    # V = R + (1, -1, 0): Var(err) = 2/3, Var(R) = 2/3 -> 0
    assert explained_variance(ret + torch.tensor([1.0, -1.0, 0.0, 5.0]), ret, mask) == pytest.approx(0.0, abs=1e-6)
    assert math.isnan(explained_variance(ret, torch.ones(4), mask))


def _two_rows() -> Rollout:
    # row 0: prompt 2, agent token, env 2 -> agent at t=2; row 1 likewise, rewards 1 and 0
    return Rollout(
        group_id="g",
        actor_id="a",
        env="e",
        task_id=0,
        episodes=[episode([1, 2], [[GOOD]], [1.0]), episode([1, 2], [[BAD]], [0.0])],
    )


def test_kl_in_the_reward_by_hand() -> None:
    b = collate([_two_rows()], pad_id=0)
    kl = torch.zeros(2, 5)
    kl[0, 2], kl[1, 2], kl[1, 0] = 0.5, 1.0, 7.0  # the 7 sits on a prompt token: ignored
    # rloo: rewards 1 - 0.1·0.5 = 0.95 and 0 - 0.1·1 = -0.1 -> A = ±1.05
    adv, _ = compute_advantages("rloo", b, kl=kl, kl_coef=0.1)
    assert adv[:, 2].tolist() == pytest.approx([1.05, -1.05]) and adv[:, [0, 1, 3, 4]].abs().sum() == 0
    # reinforce_pp: token rewards 0.95 and -0.1, whitened: ±1 (up to eps)
    adv, _ = compute_advantages("reinforce_pp", b, kl=kl, kl_coef=0.1)
    assert adv[:, 2].tolist() == pytest.approx([1.0, -1.0], abs=1e-6)
    # grpo without std: ±0.525; kl_coef = 0 ignores kl
    assert compute_advantages("grpo", b, kl=kl, kl_coef=0.1, std_normalize=False)[0][:, 2].tolist() == pytest.approx(
        [0.525, -0.525]
    )
    assert compute_advantages("grpo", b, kl=kl, kl_coef=0.0, std_normalize=False)[0][:, 2].tolist() == pytest.approx(
        [0.5, -0.5]
    )


def test_the_baseline_per_turn_through_a_collated_batch() -> None:
    # Three episodes of one group: solved at turn 0; failed after 2 turns; solved at turn 1.
    r = Rollout(
        group_id="g",
        actor_id="a",
        env="e",
        task_id=0,
        episodes=[
            episode([1, 2], [[GOOD]], [1.0]),
            episode([1, 2], [[BAD], [BAD]], [0.0, 0.0]),
            episode([1, 2], [[BAD], [GOOD]], [0.0, 1.0]),
        ],
    )
    b = collate([r], pad_id=0)
    turn, _ = compute_advantages("rloo", b, baseline="turn")
    episode_, _ = compute_advantages("rloo", b, baseline="episode")
    agent = b.loss_mask != 0
    first = agent.float().argmax(-1)  # each row's turn-0 token
    rows = torch.arange(3)
    assert turn[rows, first].tolist() == pytest.approx(episode_[rows, first].tolist())  # turn 0: RLOO's
    # turn 1, played by rows 1 (reward 0) and 2 (reward 1): leave-one-out within that cohort
    second = [int(t) for t in (agent[1].nonzero().flatten()[1], agent[2].nonzero().flatten()[1])]
    assert turn[1, second[0]].item() == pytest.approx(-1.0) and turn[2, second[1]].item() == pytest.approx(1.0)
    assert (turn[~agent] == 0).all()
    with pytest.raises(ValueError, match="baseline must be 'episode' or 'turn'"):
        compute_advantages("grpo", b, baseline="state")  # type: ignore[arg-type]  # a wrong value on purpose: the error is what is tested


def test_ppo_advantages_bootstrap_only_truncated_rows() -> None:
    b = collate([_two_rows()], pad_id=0)
    values = torch.zeros(2, 5)
    values[:, 2] = 0.25
    last = torch.tensor([2.0, 2.0])
    for truncated, boot in (([0.0, 0.0], [0.0, 0.0]), ([1.0, 0.0], [2.0, 0.0])):
        b.truncated = torch.tensor(truncated)
        bs = bootstrap_values(last, b.truncated)
        assert bs.tolist() == boot
        adv, ret = compute_advantages("ppo", b, values=values, bootstrap=bs, gamma=0.5, lam=1.0, whiten=False)
        # one agent token per row: A = r + γ·boot − V
        assert adv[:, 2].tolist() == pytest.approx([1 + 0.5 * boot[0] - 0.25, 0 - 0.25])
        assert ret[:, 2].tolist() == pytest.approx([1 + 0.5 * boot[0], 0.0])
    with pytest.raises(ValueError, match="'ppo' needs values"):
        compute_advantages("ppo", b)


def test_value_head_reads_the_state_before_each_token_and_after_the_last() -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=50,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=1,
            num_key_value_heads=1,
        )
    ).eval()
    head = ValueHead(32)
    assert head(torch.randn(3, 32)).abs().sum() == 0  # zero-initialised
    torch.nn.init.normal_(head.linear.weight)
    ids = torch.tensor([[5, 6, 7, 8], [5, 6, 0, 0]])
    attn = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    with torch.no_grad():
        f = forward_tokens(model, ids, attn, 1.0, value_head=head)
        h = model(input_ids=ids, attention_mask=attn, output_hidden_states=True).hidden_states[-1]
        v = head(h)
    assert f.values is not None and f.last_value is not None
    torch.testing.assert_close(f.values[0], torch.cat([torch.zeros(1), v[0, :3]]))
    torch.testing.assert_close(
        f.values[1], torch.stack([torch.tensor(0.0), v[1, 0], torch.tensor(0.0), torch.tensor(0.0)])
    )
    torch.testing.assert_close(f.last_value, torch.stack([v[0, 3], v[1, 1]]))


def test_rng_state_round_trip() -> None:
    s = rng_state()
    a = (torch.rand(3), np.random.rand(3), random.random())
    set_rng_state(s)
    b = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and a[2] == b[2]


@given(
    st.integers(0, 10_000),
    st.integers(1, 7),
    st.integers(1, 9),
    st.lists(st.integers(1, 4), min_size=1, max_size=7),
    st.sampled_from(["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]),
)
@settings(max_examples=80, deadline=None)
def test_micro_batch_shares_of_the_normaliser_add_up_to_the_whole_loss(seed, B, T, cuts, agg) -> None:
    """The trainer's accumulation rule: each micro-batch's aggregated loss times its share of the
    minibatch's normaliser (tokens, or episodes with tokens) sums to the loss of the whole."""
    g = torch.Generator().manual_seed(seed)
    per_token = torch.randn(B, T, generator=g, dtype=torch.float64)
    weights = (torch.rand(B, T, generator=g) < 0.6).double() * torch.rand(B, T, generator=g, dtype=torch.float64)
    keep = weights != 0
    whole = aggregate(per_token, weights, agg, norm_const=5.0)
    total = torch.zeros((), dtype=torch.float64)
    start = 0
    for c in cuts + [B]:
        rows = torch.arange(start, min(B, start + c))
        start += rows.numel()
        if rows.numel() == 0:
            break
        share = (
            keep[rows].sum().double() / keep.sum().clamp(min=1)
            if agg == "token_mean"
            else keep[rows].any(-1).sum().double() / keep.any(-1).sum().clamp(min=1)
        )
        total += aggregate(per_token[rows], weights[rows], agg, norm_const=5.0) * share
    assert float(total) == pytest.approx(float(whole), rel=1e-9, abs=1e-12)


@given(
    st.integers(0, 10_000),
    st.sampled_from(["grpo", "rloo", "reinforce_pp", "ppo"]),
    st.integers(1, 3),
    st.integers(1, 4),
)
@settings(max_examples=60, deadline=None)
def test_every_algorithms_advantages_live_on_agent_tokens_only(
    seed: int, algorithm: str, groups: int, size: int
) -> None:
    """Whatever the episodes look like (turns, environment tokens, padding), advantages are finite
    and exactly 0 on every prompt, environment and padding token; group advantages sum to 0."""
    rnd = random.Random(seed)
    rollouts = []
    for gi in range(groups):
        eps = []
        for _ in range(size):
            turns = [[rnd.choice([GOOD, BAD]) for _ in range(rnd.randint(1, 3))] for _ in range(rnd.randint(1, 3))]
            rewards = [rnd.choice([0.0, 0.5, 1.0]) for _ in turns]
            eps.append(episode([1] * rnd.randint(1, 4), turns, rewards, finish=rnd.choice(["done", "turn_limit"])))
        rollouts.append(Rollout(group_id=f"g{gi}", actor_id="a", env="e", task_id=gi, episodes=eps))
    b = collate(rollouts, pad_id=0)
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(b.input_ids.shape, generator=g)
    boot = bootstrap_values(torch.randn(b.size, generator=g), b.truncated)
    adv, ret = compute_advantages(algorithm, b, values=values, bootstrap=boot)
    agent = b.loss_mask != 0
    assert torch.isfinite(adv).all() and not adv[~agent].any()
    assert (ret is not None) == (algorithm == "ppo")
    if ret is not None:
        assert not ret[~agent].any()
    if algorithm in ("grpo", "rloo"):
        per_row = adv.sum(-1) / agent.sum(-1)
        for gi in range(groups):
            assert float(per_row[b.group_index == gi].sum()) == pytest.approx(0.0, abs=1e-5)
