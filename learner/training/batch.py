"""Rollouts to padded training tensors, and how a batch is cut into minibatches, ranks and micro-batches.

    batch = collate(rollouts, pad_id)                  # [B, T] tensors + per-episode values
    rows = shard_rows(mb_rows, batch.lengths, rank, world)
    for micro in micro_batches(rows, batch.lengths, budget): ...

Credit assignment (docs/off_policy.md, "Advantages"): ``token_rewards`` holds each turn's reward on
that turn's last agent token, and whatever part of the episode's reward the turn rewards do not
account for on the episode's last agent token, so that the token rewards of a row always sum to
its ``reward``. Environment tokens (loss mask 0) never hold a reward.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import torch

from agentgym.protocol import Episode, Rollout
from agentgym.protocol.arrays import F32, I32, U8, unpack


@dataclass
class Batch:
    input_ids: torch.Tensor  # [B, T] long
    attention_mask: torch.Tensor  # [B, T] long
    loss_mask: torch.Tensor  # [B, T] float, 1 on agent tokens
    behav_logp: torch.Tensor  # [B, T] float, the engine's logprobs (μ)
    versions: torch.Tensor  # [B, T] long, -1 on non-agent tokens
    token_rewards: torch.Tensor  # [B, T] float, rewards on agent tokens (see the module docstring)
    rewards: torch.Tensor  # [B] episode reward
    group_index: torch.Tensor  # [B] long
    success: torch.Tensor  # [B] float
    turns: torch.Tensor  # [B] float
    truncated: torch.Tensor
    """[B] float: cut by the turn limit, bootstrapped by PPO with V(s_end). The actor ends such an
    episode with the last observation and the generation prompt, the state the agent would act
    in next. A token-limit cut is terminal (0): the episode's budget is spent, no reward can follow."""
    lengths: torch.Tensor  # [B] long, real tokens per row

    def tensors(self) -> dict[str, torch.Tensor]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_tensors(cls, d: dict[str, torch.Tensor]) -> Batch:
        return cls(**d)

    def to(self, device: torch.device | str) -> Batch:
        return Batch(**{k: v.to(device) for k, v in self.tensors().items()})

    @property
    def size(self) -> int:
        return int(self.rewards.shape[0])


def trainable_episodes(rollout: Rollout) -> list[Episode]:
    """Episodes of a rollout that can be trained on (environment failures are left out)."""
    return [e for e in rollout.episodes if e.finish not in ("env_failure", "aborted")]


def credit_rewards(mask: np.ndarray, turn_ends: np.ndarray, turn_rewards: np.ndarray, reward: float) -> np.ndarray:
    """One row's token rewards: turn k's reward on the last agent token before ``turn_ends[k]``
    (exclusive ends, as ``Episode`` stores them), the rest of ``reward`` on the last agent token.

    A turn without agent tokens passes its reward on to the next turn that has one. A row
    without any agent token gets no reward (there is no action to credit; it cannot train).
    """
    out = np.zeros(mask.shape, dtype=np.float32)
    agent = np.flatnonzero(mask)
    if agent.size == 0:
        return out
    carry = np.float32(0.0)
    for end, r in zip(turn_ends.tolist(), turn_rewards.tolist(), strict=True):
        before = agent[agent < end]
        carry += np.float32(r)
        if before.size:
            out[before[-1]] += carry
            carry = np.float32(0.0)
    rest = np.float32(reward) - out.sum(dtype=np.float32)
    # The episode's reward is the float64 sum of its float32 turn rewards: ignore rounding noise.
    if abs(float(rest)) > 1e-6 * max(1.0, abs(reward)):
        out[agent[-1]] += rest
    return out


def segments(e: Episode) -> list[tuple[int, int]]:
    """``(start, end)`` of each sequence an episode trains as: the whole episode, or the segments
    of an agent conversation whose prompts stopped extending each other (``Episode.segment_ends``)."""
    n = e.num_tokens
    if not e.segment_ends:
        return [(0, n)]
    ends = unpack(e.segment_ends, I32).tolist()
    return list(zip([0, *ends[:-1]], ends))


def collate(rollouts: list[Rollout], pad_id: int) -> Batch:
    """Right-padded tensors of every trainable episode of ``rollouts``; group i = rollout i.

    An episode with segments gives one row per segment, each with the group's index and the
    episode's reward (every segment acted towards it); turn rewards stay with their segment, and
    only the last segment can be a turn-limit truncation."""
    rows: list[tuple[Episode, int, int, int, bool]] = []  # episode, start, end, group, last segment
    for gi, r in enumerate(rollouts):
        for e in trainable_episodes(r):
            spans = segments(e)
            rows += [(e, s, t, gi, k == len(spans) - 1) for k, (s, t) in enumerate(spans)]
    if not rows:
        raise ValueError(f"collate: none of the {len(rollouts)} rollouts has a trainable episode")
    T = max(t - s for _, s, t, _, _ in rows)
    B = len(rows)
    ids = np.full((B, T), pad_id, dtype=np.int64)
    attn = np.zeros((B, T), dtype=np.int64)
    mask = np.zeros((B, T), dtype=np.float32)
    behav = np.zeros((B, T), dtype=np.float32)
    vers = np.full((B, T), -1, dtype=np.int64)
    trew = np.zeros((B, T), dtype=np.float32)
    turns = []
    for i, (e, s, t, _, _) in enumerate(rows):
        n = t - s
        ids[i, :n] = unpack(e.token_ids, I32)[s:t]
        attn[i, :n] = 1
        mask[i, :n] = unpack(e.loss_mask, U8)[s:t]
        behav[i, :n] = unpack(e.logprobs, F32)[s:t]
        vers[i, :n] = unpack(e.versions, I32)[s:t]
        ends, rews = unpack(e.turn_ends, I32), unpack(e.turn_rewards, F32)
        mine = (ends > s) & (ends <= t)
        trew[i, :n] = credit_rewards(mask[i, :n], ends[mine] - s, rews[mine], e.reward)
        turns.append(float(mine.sum()))
    return Batch(
        input_ids=torch.from_numpy(ids),
        attention_mask=torch.from_numpy(attn),
        loss_mask=torch.from_numpy(mask),
        behav_logp=torch.from_numpy(behav),
        versions=torch.from_numpy(vers),
        token_rewards=torch.from_numpy(trew),
        rewards=torch.tensor([e.reward for e, *_ in rows], dtype=torch.float32),
        group_index=torch.tensor([gi for _, _, _, gi, _ in rows], dtype=torch.long),
        success=torch.tensor([float(e.success) for e, *_ in rows]),
        turns=torch.tensor(turns),
        truncated=torch.tensor([float(e.finish == "turn_limit" and last) for e, _, _, _, last in rows]),
        lengths=torch.tensor([t - s for _, s, t, _, _ in rows], dtype=torch.long),
    )


def shard_rows(rows: torch.Tensor, lengths: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """The rows of ``rows`` that data-parallel rank ``rank`` of ``world`` trains on.

    Longest first, dealt round-robin, so that ranks get similar token counts; the result is in
    ascending row order. Every row goes to exactly one rank; a rank may get none.
    """
    if not 0 <= rank < world:
        raise ValueError(f"shard_rows: rank {rank} is not in [0, {world})")
    order = torch.argsort(-lengths[rows], stable=True)
    mine = rows[order[rank::world]]
    return mine.sort().values


def micro_batches(rows: torch.Tensor, lengths: torch.Tensor, budget: int | None) -> list[torch.Tensor]:
    """Consecutive groups of ``rows`` whose padded size (rows x longest) stays within ``budget``.

    A row longer than the budget forms a micro-batch alone; None means one micro-batch.
    """
    if rows.numel() == 0:
        return []
    if budget is None:
        return [rows]
    out: list[torch.Tensor] = []
    start, longest = 0, 0
    lens = lengths[rows].tolist()
    for i, n in enumerate(lens):
        new_longest = max(longest, n)
        if i > start and new_longest * (i - start + 1) > budget:
            out.append(rows[start:i])
            start, new_longest = i, n
        longest = new_longest
    out.append(rows[start:])
    return out
