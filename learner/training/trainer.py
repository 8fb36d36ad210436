"""The learner's torch side: the policy (and PPO's critic), one learner step per batch of groups.

    trainer = Trainer.load(cfg)                 # any HF causal-LM directory; starts dp ranks
    metrics = trainer.train_step(groups)        # blocking; the trio loop runs it in a thread
    tensors = trainer.export_weights()          # RawTensors for the weight broadcast
    trainer.save(path, extra_state)             # HF dir + optimizer, step, version, RNG, extra
    extra_state = trainer.load_checkpoint(path) # resume

One learner step (docs/off_policy.md, docs/adr/0007-learner-algorithms.md):
  1. collate the groups (rank 0) and send the batch to every data-parallel rank;
  2. without gradient, on this rank's rows: the proximal logprobs π_prox (the weights at the start
     of the step; needed with several minibatches or epochs, or KL in the reward), the values and bootstrap
     values (ppo) and the reference logprobs (kl_coef > 0); summed over ranks so every rank has
     the whole batch's;
  3. advantages of the chosen algorithm on the whole batch; per-token weights from the loss mask
     and the staleness rule;
  4. per minibatch (``epochs`` passes over them): for each micro-batch of this rank's rows, the decoupled PPO loss
     −w·min(r·A, clip(r)·A) (r = π_θ/π_prox, w = min(π_prox/μ, C)), + KL, − entropy, + value loss,
     each scaled by its share of the minibatch's normaliser so that micro-batches and ranks add up
     to the loss of the whole minibatch; backward; gradients summed over ranks, clipped (a
     separate critic's on its own: learner/model/value_model.py), one step.
With one minibatch and one epoch π_prox is π_θ detached, so r = 1 and the step is REINFORCE with truncated
importance weights (exactly, not approximately).

Data parallelism (learner/training/distributed.py): with ``learner.dp_mode = "replicate"`` every rank holds
the whole model and the gradients are all-reduced after each minibatch; with ``"fsdp"`` the policy,
value head and reference model are sharded (FSDP2), every forward is a collective, and a rank with
fewer micro-batches than another runs idle ones (a 2-token forward and backward scaled by 0) so
that all ranks meet at the same collectives. Exporting and saving gather the full weights to rank 0.
"""

from __future__ import annotations

import contextlib
import copy
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import structlog
import torch
from torch.distributed.tensor import DTensor

from agentgym.config import Config
from agentgym.config.registries import ALGORITHMS
from agentgym.learner.algorithms.advantages import importance_recentred
from agentgym.learner.algorithms.estimators import bootstrap_values, compute_advantages, explained_variance, lr_factor
from agentgym.learner.algorithms.losses import aggregate, decoupled_ppo_loss, kl_penalty, truncated_weights, value_loss
from agentgym.learner.control.staleness import StalenessRule
from agentgym.learner.model.logprobs import sequence_logprobs
from agentgym.learner.model.lora import BaseModelView, wrap_lora
from agentgym.learner.model.policy import forward_tokens, load_causal_lm
from agentgym.learner.model.shared_prefix import PackedRows, attention_cost_ratio, pack_groups
from agentgym.learner.model.value_model import SeparateValueModel, ValueHead, build_value_model
from agentgym.learner.stopping import StepAbandoned
from agentgym.learner.training.batch import Batch, collate, micro_batches, shard_rows, trainable_episodes
from agentgym.learner.training.checkpoint import tied_groups
from agentgym.learner.training.distributed import DataParallel, fsdp_shard, start_ranks
from agentgym.learner.training.trainer_state import TrainerState
from agentgym.protocol import Rollout
from agentgym.protocol.vocab import banned_action_ids

__all__ = ["Batch", "Trainer", "collate", "trainable_episodes"]

log = structlog.get_logger(__name__)


# Token-weighted means summed over micro-batches and ranks (value x tokens, then / tokens).
_TOKEN_METRICS = (
    "is_weight_mean",
    "is_truncated_frac",
    "is_rejected_frac",
    "clip_frac",
    "dual_clip_frac",
    "behav_clip_frac",
    "approx_kl",
)


@dataclass
class _StepBatch:
    """What every micro-batch of one ``Trainer.train_batch`` reads: the batch on the device, the
    no-grad pass's tensors, the advantages and weights, and the step's loss switches."""

    b: Batch
    pre: dict[str, torch.Tensor]
    adv: torch.Tensor
    returns: torch.Tensor | None
    weights: torch.Tensor
    keep: torch.Tensor
    agent: torch.Tensor
    lengths: torch.Tensor  # on the CPU
    norm_const: float
    several: bool  # several optimizer steps: π_prox is the batch start's, from the no-grad pass
    kl_loss: bool


@dataclass
class _StepSums:
    """What the micro-batches of one step add up, on the device: the metric sums (float64), the
    largest importance weight and, per row, the flight recorder's KL sum and token count."""

    sums: dict[str, torch.Tensor]
    w_max: torch.Tensor
    row_kl: torch.Tensor

    @classmethod
    def zeros(cls, rows: int, device: torch.device) -> _StepSums:
        keys = (*_TOKEN_METRICS, "tokens", "loss", "pg_loss", "entropy", "kl_ref", "value_loss", "padded", "forward")
        sums = {k: torch.zeros((), dtype=torch.float64, device=device) for k in (*keys, "micro")}
        w_max = torch.zeros((), device=device)
        # Flight recorder: per row, k3 KL between the behaviour logprobs the actor reported and
        # the learner's own at the batch start (first epoch): the agreement per actor.
        row_kl = torch.zeros((2, rows), dtype=torch.float64, device=device)
        return cls(sums, w_max, row_kl)


class Trainer(TrainerState):
    """The policy (and critic), its optimizer and one learner step; exporting and checkpointing
    the weights are ``TrainerState``'s (learner/training/trainer_state.py)."""

    def __init__(
        self,
        cfg: Config,
        model: torch.nn.Module,
        pad_id: int,
        *,
        dp: DataParallel | None = None,
        tokenizer_dir: Path | None = None,
    ) -> None:
        self.cfg = cfg
        lc = cfg.learner
        self.dp = dp or DataParallel()
        self.device = self.dp.device
        self.fsdp = lc.dp_mode == "fsdp" and self.dp.active
        self.lora = lc.lora.rank > 0
        """LoRA (learner/model/lora.py): only adapters train; the reference is the adapter-less model."""
        # PPO's critic (learner/model/value_model.py); a separate one copies the body before LoRA wraps it.
        self.value_head: ValueHead | SeparateValueModel | None = (
            build_value_model(lc.value_model, model, lc.gradient_checkpointing).to(self.device)
            if ALGORITHMS.get(lc.algorithm).critic
            else None
        )
        self.model = (wrap_lora(model, lc.lora) if self.lora else model).to(self.device)
        self.model.train()
        if lc.gradient_checkpointing:
            # Non-reentrant: works with inputs that need no grad and with FSDP (torch's advice).
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})  # type: ignore[operator]  # an HF model's method, which torch.nn.Module's __getattr__ types as Tensor | Module
        self.staleness_rule = StalenessRule.from_config(cfg)
        """The per-token staleness weights (config fields only). Built once; ranks > 0 are other
        processes, so this is not the learner's object, but it reads the same fields."""
        self.pad_id = pad_id
        self.tokenizer_dir = Path(tokenizer_dir) if tokenizer_dir is not None else Path(cfg.model.path)
        self.banned = self._action_ban()
        """Token ids the policy gives probability 0 (protocol/vocab.py), as the engines sample."""
        # The reference is the policy as it is now (the initial model); a resume loads checkpoint
        # weights into the policy only, so the reference stays the initial model.
        self.ref_model: torch.nn.Module | None = None
        if lc.kl_coef > 0 and self.lora:
            self.ref_model = BaseModelView(self.model)
        elif lc.kl_coef > 0:
            self.ref_model = copy.deepcopy(self.model).eval()
            for p in self.ref_model.parameters():
                p.requires_grad_(False)
        self.attention_ratio = attention_cost_ratio(model)
        """Attention cost per (query, key) pair over linear cost per token: when packing a
        group's shared prefix pays (learner/model/shared_prefix.py)."""
        self.tied = tied_groups(self.model)
        trained = [self.model, *([self.value_head] if self.value_head is not None else [])]
        self.dp.broadcast_params([p for m in trained for p in m.parameters()])
        if self.fsdp:  # after the broadcast: every rank shards the same full weights
            for m in (*trained, self.ref_model):
                if m is not None:
                    fsdp_shard(m, self.dp)
        # Parameters are read after sharding (FSDP replaces them with sharded ones).
        self.params = [p for m in trained for p in m.parameters() if p.requires_grad]
        # The value head may learn at its own rate (learner.value_lr): the schedule scales each
        # group's base rate by the same factor.
        head = {id(p) for p in self.value_head.parameters()} if self.value_head is not None else set()
        groups: list[dict[str, Any]] = [{"params": [p for p in self.params if id(p) not in head], "lr_scale": 1.0}]
        if head:
            groups.append(
                {
                    "params": [p for p in self.params if id(p) in head],
                    "lr_scale": (lc.value_lr if lc.value_lr is not None else lc.lr) / lc.lr,
                }
            )
        self.optimizer = torch.optim.AdamW(groups, lr=lc.lr, weight_decay=lc.weight_decay, eps=lc.adam_eps)
        # Gradients clipped together, or policy and separate critic each on its own: a critic's
        # large early gradient must not shrink the policy's step.
        self.clip_sets = (
            [g["params"] for g in groups] if isinstance(self.value_head, SeparateValueModel) else [self.params]
        )
        self.trained_modules = torch.nn.ModuleDict(
            {"policy": self.model, **({"value_head": self.value_head} if self.value_head is not None else {})}
        )
        """What the optimizer trains, by name: its checkpointed state is keyed by these names."""
        self._collective = threading.Lock()
        """Held by rank 0 around a command and its collectives: the service exports weights and
        trains from different threads, and the other ranks must see the commands in order."""
        self.step = 0
        """Optimizer steps taken; the weights after step s are weight version s (``version``)."""
        self.abandon = threading.Event()
        """Set from another thread (the learner stopping on a signal): the step in progress gives up
        at its next micro-batch if no optimizer step of it was taken yet (``StepAbandoned``)."""

    def _action_ban(self) -> torch.Tensor | None:
        if self.cfg.rollout.allow_special_tokens:
            return None
        from transformers import AutoTokenizer

        ids = banned_action_ids(AutoTokenizer.from_pretrained(self.tokenizer_dir))
        return torch.tensor(ids, dtype=torch.long, device=self.device) if ids else None

    @classmethod
    def build(cls, cfg: Config, dp: DataParallel) -> Trainer:
        """This rank's trainer, from ``model.path`` (every rank builds the same one)."""
        from transformers import AutoTokenizer

        if cfg.learner.threads:
            torch.set_num_threads(cfg.learner.threads)
        torch.manual_seed(cfg.run.seed + dp.rank)
        lc = cfg.learner
        model = load_causal_lm(
            cfg.model.path, torch.float32 if lc.param_dtype == "float32" else getattr(torch, cfg.model.dtype)
        )
        tok = AutoTokenizer.from_pretrained(cfg.model.path)
        pad = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
        return cls(cfg, model, pad, dp=dp)

    @classmethod
    def load(cls, cfg: Config) -> Trainer:
        """The learner process's trainer: rank 0, with ranks 1.. started if learner.dp_size > 1."""
        return cls.build(cfg, start_ranks(cfg, cls.build))

    def close(self) -> None:
        """Stop the other data-parallel ranks (no-op with one)."""
        self.dp.close()

    def rank_divergence(self) -> float:
        """Rank 0: the largest difference between any rank's weights and rank 0's (0.0: in sync).
        With fsdp each rank holds different shards and no copy that could drift: 0.0."""
        if self.fsdp:
            return 0.0
        with self._collective:
            self.dp.send_command("divergence")
            return self.dp.max_divergence(self.params)

    # ------------------------------------------------------------------ training
    @property
    def version(self) -> int:
        """The weight version these weights are: the number of optimizer steps that made them."""
        return self.step

    def train_step(self, rollouts: list[Rollout]) -> dict[str, float]:
        """One learner step on a batch of groups (rank 0; the batch goes to every rank)."""
        batch = collate(rollouts, self.pad_id)
        with self._collective:
            return self.train_batch(self.dp.send_step(batch))

    @property
    def compute_dtype(self) -> torch.dtype | None:
        """The autocast dtype of forward and backward passes, or None (the weights' own): mixed
        precision when the weights are float32 masters of a bfloat16/float16 model
        (``learner.param_dtype``), or ``learner.bf16_autocast``."""
        lc, dtype = self.cfg.learner, self.cfg.model.dtype
        if lc.param_dtype == "float32" and dtype != "float32":
            return getattr(torch, dtype)
        return torch.bfloat16 if lc.bf16_autocast else None

    def _check_abandon(self, stepped: bool) -> None:
        """Raise ``StepAbandoned`` when asked to and the step can still be dropped whole: before
        its first optimizer step, and with no other rank that would wait in a collective for us."""
        if self.abandon.is_set() and not stepped and not self.dp.active:
            self.optimizer.zero_grad(set_to_none=True)
            raise StepAbandoned(f"step {self.step + 1} abandoned before its first optimizer step")

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        dtype = self.compute_dtype
        return torch.autocast(self.device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()

    def _micro_plan(self, mb: torch.Tensor, lengths: torch.Tensor) -> list[torch.Tensor | None]:
        """This rank's micro-batches of minibatch ``mb``; with fsdp padded with None (an idle
        micro-batch) to the most any rank has, since every forward is a collective."""
        budget, world = self.cfg.learner.micro_batch_tokens, self.dp.world
        mine: list[torch.Tensor | None] = list(
            micro_batches(shard_rows(mb, lengths, self.dp.rank, world), lengths, budget)
        )
        if self.fsdp:
            most = max(len(micro_batches(shard_rows(mb, lengths, r, world), lengths, budget)) for r in range(world))
            mine += [None] * (most - len(mine))
        return mine

    def _pack(self, b: Batch, rows: torch.Tensor, L: int) -> PackedRows | None:
        """Micro-batch ``rows`` packed by group (``learner.shared_prefix``), or None: unpacked."""
        if not self.cfg.learner.shared_prefix or self.value_head is not None:
            return None
        return pack_groups(b.input_ids[rows, :L], b.lengths[rows], b.group_index[rows], ratio=self.attention_ratio)

    def _idle_forward(self, *, policy: bool, ref: bool) -> torch.Tensor:
        """The forward passes a micro-batch makes (the policy with its value head, the
        reference), on a 2-token row of padding, as a 0-valued loss whose backward gives zero
        gradients: with fsdp, this rank's part in the other ranks' collectives."""
        ids = torch.full((1, 2), self.pad_id, dtype=torch.long, device=self.device)
        attn = torch.ones_like(ids)
        temp = self.cfg.rollout.temperature
        z = torch.zeros((), device=self.device)
        with self._autocast():
            if policy:
                f = forward_tokens(self.model, ids, attn, temp, value_head=self.value_head, banned=self.banned)
                z = z + f.logp.sum() + f.entropy.sum()
                if f.values is not None and f.last_value is not None:
                    z = z + f.values.sum() + f.last_value.sum()
            if ref and self.ref_model is not None:
                z = z + sequence_logprobs(self.ref_model, ids, attn, temp, banned=self.banned).sum()
        return z * 0.0

    def _no_grad_pass(self, b: Batch, micros: list[torch.Tensor | None], need_prox: bool) -> dict[str, torch.Tensor]:
        """π_prox, V, V(s_end) and π_ref on this rank's rows, then summed over ranks (zeros elsewhere)."""
        temp = self.cfg.rollout.temperature
        B, T = b.input_ids.shape
        out: dict[str, torch.Tensor] = {}
        if need_prox or self.value_head is not None:
            out["prox"] = torch.zeros(B, T, device=self.device)
        if self.value_head is not None:
            out["values"] = torch.zeros(B, T, device=self.device)
            out["last_value"] = torch.zeros(B, device=self.device)
        if self.ref_model is not None:
            out["ref"] = torch.zeros(B, T, device=self.device)
        if not out:
            return out
        with torch.no_grad(), self._autocast():
            for rows in micros:
                self._check_abandon(stepped=False)
                if rows is None:  # the same forwards as a real micro-batch below
                    self._idle_forward(policy="prox" in out, ref=self.ref_model is not None)
                    continue
                L = int(b.lengths[rows].max())
                ids, attn = b.input_ids[rows, :L], b.attention_mask[rows, :L]
                agent = b.loss_mask[rows, :L] != 0  # no loss reads another token's logprob
                packed = self._pack(b, rows, L)
                if "prox" in out:
                    f = forward_tokens(
                        self.model,
                        ids,
                        attn,
                        temp,
                        value_head=self.value_head,
                        banned=self.banned,
                        needed=agent,
                        packed=packed,
                    )
                    out["prox"][rows, :L] = f.logp.float()
                    if f.values is not None and f.last_value is not None:
                        out["values"][rows, :L] = f.values.float()
                        out["last_value"][rows] = f.last_value.float()
                if self.ref_model is not None:
                    out["ref"][rows, :L] = sequence_logprobs(
                        self.ref_model, ids, attn, temp, banned=self.banned, needed=agent, packed=packed
                    ).float()
        for v in out.values():
            self.dp.all_reduce_(v)
        return out

    def train_batch(self, b: Batch) -> dict[str, float]:
        """The learner step on a collated batch that every rank holds (see the module docstring)."""
        t0 = time.perf_counter()
        cfg, lc = self.cfg, self.cfg.learner
        b = b.to(self.device)
        B = b.size
        lr = lc.lr * lr_factor(
            self.step,
            warmup_steps=lc.warmup_steps,
            total_steps=cfg.run.max_steps,
            schedule=lc.lr_schedule,
            min_ratio=lc.min_lr_ratio,
        )
        lengths = b.lengths.cpu()
        n_mb = min(lc.minibatches, B)
        minibatches = list(torch.arange(B).chunk(n_mb))
        micros = [self._micro_plan(mb, lengths) for mb in minibatches]
        kl_reward = lc.kl_coef > 0 and lc.kl_mode == "reward"
        kl_loss = lc.kl_coef > 0 and lc.kl_mode == "loss"
        several = n_mb > 1 or lc.epochs > 1  # several optimizer steps: pi_prox is the batch start's
        recentre = (
            lc.importance_baseline
            and ALGORITHMS.get(lc.algorithm).group_relative
            and bool(((b.versions >= 0) & (b.versions < self.version)).any())
        )
        pre = self._no_grad_pass(b, [m for ms in micros for m in ms], need_prox=several or kl_reward or recentre)

        # Advantages on the whole batch: identical on every rank.
        agent = b.loss_mask != 0
        adv, returns, weights, keep = self._advantages(b, pre, kl_reward=kl_reward, recentre=recentre)
        norm_const = lc.loss_norm_const if lc.loss_norm_const is not None else float(cfg.rollout.max_episode_tokens)
        batch = _StepBatch(b, pre, adv, returns, weights, keep, agent, lengths, norm_const, several, kl_loss)
        acc = _StepSums.zeros(B, self.device)
        first_epoch = {int(m[0]) for m in minibatches}
        grad_norms: list[list[float]] = []
        stepped = 0
        for mb, mb_micros in [pair for _ in range(lc.epochs) for pair in zip(minibatches, micros, strict=True)]:
            tok_total = keep[mb].sum()
            seq_total = keep[mb].any(-1).sum()
            if int(tok_total) == 0:
                continue  # nothing trainable in this minibatch (e.g. all of it too stale)
            self.optimizer.zero_grad(set_to_none=True)
            for rows in mb_micros:
                self._check_abandon(stepped=bool(grad_norms))
                if rows is None:
                    self._idle_forward(policy=True, ref=False).backward()
                    continue
                self._micro_step(batch, acc, rows, tok_total, seq_total, first_epoch=int(mb[0]) in first_epoch)
            stepped += self._optimizer_step(lr, grad_norms)
            first_epoch.discard(int(mb[0]))
        self.optimizer.zero_grad(set_to_none=True)
        keys = list(acc.sums)
        vec = self.dp.all_reduce_(torch.stack([acc.sums[k] for k in keys]))
        tot = dict(zip(keys, vec.tolist(), strict=True))
        w_max_all = float(self.dp.all_reduce_(acc.w_max, op="max"))

        staleness = (self.version - b.versions[agent]).float()
        self.step += 1
        return self._step_metrics(
            b, tot, w_max_all, grad_norms, stepped, lr, adv, returns, weights, agent, staleness, pre, acc.row_kl, t0
        )

    def _micro_step(
        self,
        sb: _StepBatch,
        acc: _StepSums,
        rows: torch.Tensor,
        tok_total: torch.Tensor,
        seq_total: torch.Tensor,
        *,
        first_epoch: bool,
    ) -> None:
        """One micro-batch of ``train_batch``: forward, loss, backward (the gradient accumulates
        until the minibatch's optimizer step), and its sums added to ``acc``."""
        lc, b, keep = self.cfg.learner, sb.b, sb.keep
        L = int(sb.lengths[rows].max())
        ids, attn, w = b.input_ids[rows, :L], b.attention_mask[rows, :L], sb.weights[rows, :L]
        loc_tok = keep[rows, :L].sum()
        tok_scale = loc_tok / tok_total
        scale = tok_scale if lc.loss_agg == "token_mean" else keep[rows, :L].any(-1).sum() / seq_total
        packed = self._pack(b, rows, L)
        with self._autocast():
            f = forward_tokens(
                self.model,
                ids,
                attn,
                self.cfg.rollout.temperature,
                value_head=self.value_head,
                banned=self.banned,
                needed=sb.agent[rows, :L],
                packed=packed,
            )
        prox = sb.pre["prox"][rows, :L] if sb.several else f.logp.detach()
        if first_epoch:
            d = (prox - b.behav_logp[rows, :L]).double()
            acc.row_kl[0, rows] += ((torch.expm1(d) - d) * keep[rows, :L]).sum(-1)
            acc.row_kl[1, rows] += keep[rows, :L].sum(-1)
        pg, m = decoupled_ppo_loss(
            f.logp,
            prox,
            b.behav_logp[rows, :L],
            sb.adv[rows, :L],
            w,
            clip_low=lc.clip_low,
            clip_high=lc.clip_high,
            behav_weight_cap=lc.tis_cap,
            behav_reject_above=lc.tis_reject_above,
            agg=lc.loss_agg,
            norm_const=sb.norm_const,
            dual_clip=lc.dual_clip,
            behav_clip=lc.behav_clip,
        )
        loss = pg
        if lc.entropy_coef > 0:
            loss = loss - lc.entropy_coef * aggregate(f.entropy, w, lc.loss_agg, sb.norm_const)
        sums = acc.sums
        if self.ref_model is not None:
            kl_tok = kl_penalty(f.logp, sb.pre["ref"][rows, :L], lc.kl_estimator)
            if sb.kl_loss:
                loss = loss + lc.kl_coef * aggregate(kl_tok, w, lc.loss_agg, sb.norm_const)
            sums["kl_ref"] += (kl_tok.detach() * keep[rows, :L]).sum()
        loss = loss * scale
        if self.value_head is not None and f.values is not None and sb.returns is not None:
            vl = value_loss(f.values, sb.pre["values"][rows, :L], sb.returns[rows, :L], w, lc.value_clip)
            loss = loss + lc.value_coef * vl * tok_scale
            sums["value_loss"] += vl.detach() * loc_tok
        loss.backward()
        n = m["num_tokens"]
        for k in _TOKEN_METRICS:
            sums[k] += m[k] * n
        acc.w_max = torch.maximum(acc.w_max, m["is_weight_max"])
        sums["tokens"] += n
        sums["loss"] += loss.detach()
        sums["pg_loss"] += pg.detach() * scale
        sums["entropy"] += (f.entropy.detach() * keep[rows, :L]).sum()
        sums["padded"] += rows.numel() * L
        sums["forward"] += packed.packed_tokens if packed is not None else int(b.lengths[rows].sum())
        sums["micro"] += 1

    def _advantages(
        self, b: Batch, pre: dict[str, torch.Tensor], *, kl_reward: bool, recentre: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor]:
        """The batch's advantages (and returns, with a critic), each token's staleness weight and
        whether it trains at all: (adv, returns, weights, keep)."""
        lc = self.cfg.learner
        bootstrap = None
        if self.value_head is not None:
            cut = b.truncated if lc.truncation == "bootstrap" else torch.zeros_like(b.truncated)
            bootstrap = bootstrap_values(pre["last_value"], cut)
        kl_prox = kl_penalty(pre["prox"], pre["ref"], lc.kl_estimator) if kl_reward else None
        adv, returns = compute_advantages(
            lc.algorithm,
            b,
            kl=kl_prox,
            kl_coef=lc.kl_coef,
            std_normalize=lc.std_normalize,
            gamma=lc.gamma,
            lam=lc.gae_lambda,
            values=pre.get("values"),
            bootstrap=bootstrap,
            whiten=lc.whiten_advantages,
            baseline=lc.baseline,
            turn_discount=lc.turn_discount,
            step_weight=lc.step_advantage_weight,
        )
        weights = b.loss_mask * self.staleness_rule.token_weights(b.versions, self.version).to(b.loss_mask.dtype)
        keep = weights != 0
        if recentre:  # stale rows: the group baseline under pi_prox (learner/algorithms/advantages.py)
            ratio = torch.where(keep, torch.exp(pre["prox"] - b.behav_logp), 0.0)
            adv = importance_recentred(
                adv, weights * truncated_weights(ratio, lc.tis_cap, lc.tis_reject_above), b.group_index
            )
        if lc.negative_advantage_scale != 1.0:  # last: on the advantages the loss reads, baselines and all
            adv = torch.where(adv < 0, adv * lc.negative_advantage_scale, adv)
        return adv, returns, weights, keep

    def _optimizer_step(self, lr: float, grad_norms: list[list[float]]) -> bool:
        """One optimizer step on the summed gradients, its gradient norms appended to ``grad_norms``;
        whether the weights moved."""
        lc = self.cfg.learner
        if not self.fsdp:  # fsdp has summed them (reduce-scatter) in each backward
            self.dp.all_reduce_grads(self.params)
        gns = [torch.nn.utils.clip_grad_norm_(ps, lc.max_grad_norm) for ps in self.clip_sets]
        grad_norms.append([float(gn.full_tensor() if isinstance(gn, DTensor) else gn) for gn in gns])
        # An exactly zero gradient (every advantage 0 and no other term) must not move the
        # weights, which AdamW's momentum would: the step runs at lr 0 (its moments and count
        # advance as in any step, so a run whose first batches carry nothing keeps its course).
        # The one place the optimizer's lr is set (the schedule's, times a group's lr_scale).
        moved = any(grad_norms[-1])
        for g in self.optimizer.param_groups:
            g["lr"] = lr * g.get("lr_scale", 1.0) if moved else 0.0
        self.optimizer.step()
        return moved

    def _step_metrics(
        self,
        b: Batch,
        tot: dict[str, float],
        w_max: float,
        grad_norms: list[list[float]],
        stepped: int,
        lr: float,
        adv: torch.Tensor,
        returns: torch.Tensor | None,
        weights: torch.Tensor,
        agent: torch.Tensor,
        staleness: torch.Tensor,
        pre: dict[str, torch.Tensor],
        row_kl: torch.Tensor,
        t0: float,
    ) -> dict[str, float]:
        """The step's metrics record (the row KL reduced across ranks here, as every rank adds its rows)."""
        lc, B = self.cfg.learner, b.size
        n_tok = max(tot["tokens"], 1.0)
        steps = max(len(grad_norms), 1)
        out: dict[str, Any] = {k: tot[k] / n_tok for k in _TOKEN_METRICS}  # floats, and one list per group
        out.update(
            loss=tot["loss"] / steps,
            pg_loss=tot["pg_loss"] / steps,
            entropy=tot["entropy"] / n_tok,
            is_weight_max=w_max,
            grad_norm=float(np.mean([g[0] for g in grad_norms])) if grad_norms else 0.0,
            optimizer_steps=float(stepped),
            lr=lr,
            reward_mean=float(b.rewards.mean()),
            success_rate=float(b.success.mean()),
            episodes=float(B),
            agent_tokens=float(agent.sum()),
            trained_tokens=tot["tokens"],
            tokens=float(b.lengths.sum()),
            padded_tokens=tot["padded"],
            forward_tokens=tot["forward"],
            micro_batches=tot["micro"],
            turns_mean=float(b.turns.mean()),
            truncated_frac=float(b.truncated.mean()),
            advantage_abs_mean=float(adv[agent].abs().mean()) if agent.any() else 0.0,
            staleness_mean=float(staleness.mean()) if staleness.numel() else 0.0,
            staleness_max=float(staleness.max()) if staleness.numel() else 0.0,
            staleness_max_trained=float(staleness[weights[agent] > 0].max())
            if bool((weights[agent] > 0).any())
            else 0.0,
            staleness_weight_mean=float(weights[agent].mean()) if agent.any() else 0.0,
            train_time_s=time.perf_counter() - t0,
        )
        # Histogram of token staleness: share of agent tokens s versions old, s = 0..K, and > K.
        K = lc.max_staleness
        for s in range(K + 1):
            out[f"staleness_frac_{s}"] = float((staleness == s).float().mean()) if staleness.numel() else 0.0
        out[f"staleness_frac_gt{K}"] = float((staleness > K).float().mean()) if staleness.numel() else 0.0
        if self.ref_model is not None:
            out["kl_ref"] = tot["kl_ref"] / n_tok
        row_kl = self.dp.all_reduce_(row_kl).cpu()  # every rank adds the rows it trained
        groups = b.group_index.cpu()
        kl_sum = torch.zeros(int(groups.max()) + 1, dtype=torch.float64).index_add_(0, groups, row_kl[0])
        n_sum = torch.zeros_like(kl_sum).index_add_(0, groups, row_kl[1])
        out["group_mismatch_kl"] = [float(k / n) if n > 0 else -1.0 for k, n in zip(kl_sum, n_sum)]
        if self.value_head is not None and returns is not None:
            out["value_loss"] = tot["value_loss"] / n_tok
            out["value_mean"] = float(pre["values"][agent].mean()) if agent.any() else 0.0
            out["explained_variance"] = explained_variance(pre["values"], returns, agent.float())
            if len(self.clip_sets) > 1:  # the separate critic's own gradient norm
                out["value_grad_norm"] = float(np.mean([g[1] for g in grad_norms])) if grad_norms else 0.0
        return out
