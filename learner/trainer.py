"""The learner's torch side: the policy, one optimizer step per batch of groups, weight export.

    trainer = Trainer.load(cfg)                 # any HF causal-LM directory
    metrics = trainer.train_step(groups)        # blocking; the trio loop runs it in a thread
    tensors = trainer.export_weights()          # RawTensors for the weight broadcast

One step (GRPO with decoupled-PPO off-policy correction, docs/off_policy.md):
  1. advantages: each group's episode rewards, normalised within the group;
  2. proximal logprobs: the current weights before the step (no grad);
  3. per minibatch: recompute logprobs, loss = -w * min(r A, clip(r) A) with r = pi/pi_prox and
     w = min(pi_prox/mu, C) from the behaviour logprobs mu of every token; then clip and step.
The reward of an episode sits on its last agent token; environment tokens have loss mask 0.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import structlog
import torch

from agentgym.config import Config
from agentgym.learner.advantages import broadcast_sequence_advantages, grpo_advantages
from agentgym.learner.logprobs import sequence_logprobs
from agentgym.learner.losses import decoupled_ppo_loss, staleness_weights
from agentgym.protocol import Episode, Rollout
from agentgym.protocol.arrays import F32, I32, U8, unpack
from agentgym.protocol.weights import RawTensor

log = structlog.get_logger(__name__)


@dataclass
class Batch:
    input_ids: torch.Tensor  # [B, T] long
    attention_mask: torch.Tensor  # [B, T]
    loss_mask: torch.Tensor  # [B, T] float
    behav_logp: torch.Tensor  # [B, T] float
    versions: torch.Tensor  # [B, T] long (-1 on non-agent tokens)
    rewards: torch.Tensor  # [B]
    group_index: torch.Tensor  # [B] long
    success: torch.Tensor  # [B] float
    turns: torch.Tensor  # [B] float
    truncated: torch.Tensor  # [B] float


def trainable_episodes(rollout: Rollout) -> list[Episode]:
    """Episodes of a rollout that can be trained on (environment failures are left out)."""
    return [e for e in rollout.episodes if e.finish not in ("env_failure", "aborted")]


def collate(rollouts: list[Rollout], pad_id: int) -> Batch:
    episodes: list[Episode] = []
    groups: list[int] = []
    for gi, r in enumerate(rollouts):
        eps = trainable_episodes(r)
        episodes += eps
        groups += [gi] * len(eps)
    T = max(e.num_tokens for e in episodes)
    B = len(episodes)
    ids = np.full((B, T), pad_id, dtype=np.int64)
    attn = np.zeros((B, T), dtype=np.int64)
    mask = np.zeros((B, T), dtype=np.float32)
    behav = np.zeros((B, T), dtype=np.float32)
    vers = np.full((B, T), -1, dtype=np.int64)
    for i, e in enumerate(episodes):
        n = e.num_tokens
        ids[i, :n] = unpack(e.token_ids, I32)
        attn[i, :n] = 1
        mask[i, :n] = unpack(e.loss_mask, U8)
        behav[i, :n] = unpack(e.logprobs, F32)
        vers[i, :n] = unpack(e.versions, I32)
    return Batch(
        input_ids=torch.from_numpy(ids),
        attention_mask=torch.from_numpy(attn),
        loss_mask=torch.from_numpy(mask),
        behav_logp=torch.from_numpy(behav),
        versions=torch.from_numpy(vers),
        rewards=torch.tensor([e.reward for e in episodes], dtype=torch.float32),
        group_index=torch.tensor(groups, dtype=torch.long),
        success=torch.tensor([float(e.success) for e in episodes]),
        turns=torch.tensor([float(e.num_turns) for e in episodes]),
        truncated=torch.tensor([float(e.truncated) for e in episodes]),
    )


class Trainer:
    def __init__(self, cfg: Config, model: torch.nn.Module, pad_id: int) -> None:
        self.cfg = cfg
        self.model = model
        self.pad_id = pad_id
        lc = cfg.learner
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=lc.lr, weight_decay=lc.weight_decay)
        self.version = 0
        self.step = 0

    @classmethod
    def load(cls, cfg: Config) -> Trainer:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if cfg.learner.threads:
            torch.set_num_threads(cfg.learner.threads)
        torch.manual_seed(cfg.run.seed)
        dtype = getattr(torch, cfg.model.dtype)
        model = AutoModelForCausalLM.from_pretrained(cfg.model.path, dtype=dtype)
        model.train()
        tok = AutoTokenizer.from_pretrained(cfg.model.path)
        pad = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
        return cls(cfg, model, pad)

    def train_step(self, rollouts: list[Rollout]) -> dict[str, float]:
        """One optimizer step (or ``minibatches`` of them) on a batch of groups."""
        t0 = time.perf_counter()
        lc = self.cfg.learner
        b = collate(rollouts, self.pad_id)
        adv_seq = grpo_advantages(b.rewards, b.group_index, std_normalize=lc.std_normalize)
        advantages = broadcast_sequence_advantages(adv_seq, b.loss_mask)
        weights = b.loss_mask
        if lc.staleness_mode == "downweight":
            weights = weights * staleness_weights(
                b.versions, self.version, lc.max_staleness, mode="downweight"
            )
        temp = self.cfg.rollout.temperature
        n_mb = min(lc.minibatches, len(b.rewards))
        prox = None
        if n_mb > 1:  # the proximal policy: these weights, before any update of this batch
            with torch.no_grad():
                prox = sequence_logprobs(self.model, b.input_ids, b.attention_mask, temp)
        stats: dict[str, list[float]] = {}
        grad_norms = []
        for idx in torch.arange(len(b.rewards)).chunk(n_mb):
            logp = sequence_logprobs(self.model, b.input_ids[idx], b.attention_mask[idx], temp)
            prox_mb = logp.detach() if prox is None else prox[idx]
            loss, m = decoupled_ppo_loss(
                logp,
                prox_mb,
                b.behav_logp[idx],
                advantages[idx],
                weights[idx],
                clip_low=lc.clip_low,
                clip_high=lc.clip_high,
                behav_weight_cap=lc.tis_cap,
            )
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            gn = torch.nn.utils.clip_grad_norm_(self.model.parameters(), lc.max_grad_norm)
            self.optimizer.step()
            grad_norms.append(float(gn))
            stats.setdefault("loss", []).append(float(loss))
            for k, v in m.items():
                stats.setdefault(k, []).append(float(v))
        self.step += 1
        self.version += 1
        agent = b.loss_mask > 0
        staleness = (self.version - 1 - b.versions[agent]).float()
        out = {k: float(np.mean(v)) for k, v in stats.items()}
        out.update(
            grad_norm=float(np.mean(grad_norms)),
            reward_mean=float(b.rewards.mean()),
            success_rate=float(b.success.mean()),
            episodes=float(len(b.rewards)),
            agent_tokens=float(agent.sum()),
            turns_mean=float(b.turns.mean()),
            truncated_frac=float(b.truncated.mean()),
            staleness_mean=float(staleness.mean()) if staleness.numel() else 0.0,
            staleness_max=float(staleness.max()) if staleness.numel() else 0.0,
            train_time_s=time.perf_counter() - t0,
        )
        return out

    def export_weights(self, dtype: str = "float32") -> list[RawTensor]:
        """The current weights as raw named tensors (HF names, as vLLM's loaders expect)."""
        out = []
        tdtype = getattr(torch, dtype)
        for name, t in self.model.state_dict().items():
            t = t.detach().to(tdtype).contiguous().cpu()
            raw = t.view(torch.uint8) if t.element_size() == 1 else t.view(torch.int16 if t.element_size() == 2 else torch.int32)
            out.append(RawTensor(name, dtype, tuple(t.shape), raw.numpy().tobytes()))
        return out

    def save(self, path: Path, tokenizer_dir: Path) -> None:
        """An HF checkpoint directory that vLLM and transformers load directly."""
        import shutil

        path.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(path)
        for f in Path(tokenizer_dir).iterdir():
            if f.name.startswith(("tokenizer", "special_tokens", "vocab", "merges", "chat_template")):
                shutil.copy(f, path / f.name)
