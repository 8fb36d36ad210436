"""The ``[learner]`` section of the configuration tree, with its ``[learner.lora]``. Import them
from ``agentgym.config``, which assembles every section into ``Config``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, model_validator

from agentgym.config.registries import ALGORITHMS
from agentgym.config.sections import Section, check_tcp
from agentgym.protocol.limits import DEFAULT_CHUNK_MIB

# The estimators the step-relative term (learner.step_advantage_weight) may be added to: the
# group-relative ones, and reinforce_pp, whose per-token return has no baseline of its state (the
# term supplies one: the other turns of the group that acted on the same observation). PPO's
# critic is that baseline already. The registry (agentgym/config/registries.py) marks them.
STEP_TERM_ALGORITHMS = ALGORITHMS.with_("step_term")
GROUP_RELATIVE_ALGORITHMS = ALGORITHMS.with_("group_relative")


class LoraConfig(Section):
    """LoRA adapters (peft): the learner trains only low-rank adapters on the base model and each
    weight version ships only them; actors serve them as LoRA adapters
    (docs/adr/0012-lora-and-multinode-learner.md)."""

    rank: Annotated[int, Field(ge=0, le=512)] = 0
    """Adapter rank r; 0 turns LoRA off (full fine-tuning)."""
    alpha: Annotated[float, Field(gt=0)] = 16.0
    """LoRA alpha: the adapter's update is scaled by alpha / rank."""
    dropout: Annotated[float, Field(ge=0, lt=1)] = 0.0
    """Dropout on the adapters' input while training. Anything above 0 makes the learner's
    forwards stochastic, so pi_prox and the importance weights see noise: keep 0 for RL."""
    target_modules: Annotated[list[str], Field(min_length=1)] = [
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    ]
    """Names of the linear layers that get adapters (peft's target_modules; vLLM serves
    adapters on the attention and MLP projections of the usual decoder architectures)."""


class LearnerConfig(Section):
    bind: str = "tcp://127.0.0.1:5555"
    """Control socket address; the weight server binds the next port."""
    lr: Annotated[float, Field(gt=0)] = 1e-3
    """Peak AdamW learning rate (after warm-up; see lr_schedule)."""
    weight_decay: Annotated[float, Field(ge=0)] = 0.0
    """AdamW's decoupled weight decay."""
    adam_eps: Annotated[float, Field(gt=0, le=1e-2)] = 1e-8
    """AdamW's epsilon (step = m / (sqrt(v) + eps); 1e-8 is torch's default). Set above the tiny
    gradients of the output rows of tokens that are never sampled, it stops Adam from scaling
    them up to full-size steps, at the price of damping every small gradient (docs/results-log.md,
    "Maze 3x3 and two-digit guesses from a base model")."""
    max_grad_norm: Annotated[float, Field(gt=0)] = 1.0
    """Gradient clipping: the global L2 norm of each optimizer step's gradient is cut to this."""
    batch_groups: Annotated[int, Field(ge=1)] = 8
    """Groups (tickets) per optimizer step."""
    minibatches: Annotated[int, Field(ge=1)] = 1
    """Optimizer steps per batch (PPO-style minibatching; the proximal policy is the batch start)."""
    epochs: Annotated[int, Field(ge=1)] = 1
    """Passes over each batch (PPO's epochs): ``epochs x minibatches`` optimizer steps per learner
    step, every one clipped against the proximal policy of the batch start. More learning per
    played episode where the learner would otherwise wait for data; the weight version still
    moves by one per batch."""
    clip_low: Annotated[float, Field(gt=0, lt=1)] = 0.2
    """PPO clip: the ratio pi_theta/pi_prox is clipped below at 1 - clip_low."""
    clip_high: Annotated[float, Field(gt=0)] = 0.28
    """PPO clip above at 1 + clip_high (> clip_low: DAPO's clip-higher)."""
    tis_cap: Annotated[float, Field(ge=1)] | None = 2.0
    """Cap C of the behaviour->proximal importance weight (None: uncapped)."""
    max_staleness: Annotated[int, Field(ge=0)] = 4
    """Largest allowed (learner version - token version). Tickets are issued so that it is rarely
    exceeded; rollouts beyond it are handled by ``staleness_mode``."""
    staleness_mode: Literal["drop", "downweight"] = "downweight"
    """What happens to tokens more than max_staleness versions old: downweight (weight
    staleness_decay^(s - max_staleness); nothing played is thrown away) or drop (weight 0; a
    rollout with no token within the bound is refused). ADR 0013, addendum."""
    std_normalize: bool = True
    """GRPO: divide group-centred rewards by the group's std (False: Dr. GRPO)."""
    baseline: Literal["episode", "turn"] = "turn"
    """What grpo and rloo subtract from an episode's reward: "turn", for the tokens of turn k, the
    mean of the group's episodes that reached turn k (learner/algorithms/advantages.py:
    turn_baseline_advantages); "episode", the mean of its whole group (every token of the episode
    gets one advantage, as in GRPO on single-turn tasks, where the two are the same). Late turns are
    mostly played by episodes that go on to fail: under "episode" their tokens are all pushed down,
    which moves probability off the actions onto tokens that are not actions; runs from a
    pretrained base fell that way (docs/off_policy.md, "A baseline per turn"). ppo and reinforce_pp
    have per-token baselines of their own (the critic, the batch whitening) and ignore it, as
    grpo ignores ``gamma``."""
    heartbeat_interval_s: Annotated[float, Field(gt=0)] = 1.0
    actor_timeout_s: Annotated[float, Field(gt=0)] = 30.0
    """An actor silent for this long is dropped and its tickets are given to others."""
    ticket_deadline_factor: Annotated[float, Field(ge=1)] = 3.0
    """A ticket's deadline is this many times the p95 of its actor's recent grant-to-answer times
    (the fleet's while it has answered none); past it the ticket, and every other one its
    actor holds, is issued again to another actor and the first answer is trained
    (docs/operations.md, "Stragglers"; learner/control/deadlines.py)."""
    ticket_deadline_min_s: Annotated[float, Field(gt=0)] = 2.0
    """Floor of a ticket's deadline, in seconds."""
    ticket_deadline_max_s: Annotated[float, Field(gt=0)] = 900.0
    """Cap of a ticket's deadline, in seconds (also the deadline while no actor has answered)."""
    grant_start: Annotated[int, Field(ge=1)] = 2
    """Tickets a new actor may hold before it has answered any; each group it answers first and
    in time lets it hold one more (up to its capacity and its share of the pipeline), each
    missed deadline halves that."""
    refuse_digest_mismatch: bool = False
    """Flight recorder: refuse (ack ``invalid``, reason ``weights_digest_mismatch``) the rollouts
    of an actor whose reported weight digest for its current version differs from the learner's
    export. Off: the mismatch is logged, counted and alarmed, and its rollouts are judged as usual."""
    logprob_outlier_kl: Annotated[float, Field(gt=0)] = 0.05
    """Flight recorder: an actor whose behaviour logprobs disagree with the learner's by more than
    this mean per-token KL (k3) over a step's groups of one lag, and by more than 4 times the
    median of the other actors' at that lag and more than this above it, is flagged
    (logprob_outlier)."""
    inbox_mib: Annotated[int, Field(ge=1)] = 256
    """Bytes of unread messages ZeroMQ may hold per actor on the control port: its receive queue
    holds as many messages as groups of the largest size fit in this (learner/control/bounds.py)."""
    weight_chunk_mib: Annotated[int, Field(ge=1, le=1024)] = DEFAULT_CHUNK_MIB
    """Size of a weight chunk (one ZeroMQ frame). Below glibc's mmap threshold (32 MiB as
    agentgym's processes set it, agentgym/host/allocator.py), an actor's received frames reuse freed
    memory instead of faulting in fresh pages (docs/adr/0011-weight-transfer.md)."""
    threads: Annotated[int, Field(ge=0)] = 0
    """torch threads for training (0: torch's default)."""
    log_episodes: Annotated[int, Field(ge=0)] = 2
    """Episodes per optimizer step and per evaluation round decoded into RUN_DIR/episodes.jsonl
    (best and worst of a group, alternately); ``agentgym view RUN_DIR`` shows them. 0: none."""
    checkpoint_every: Annotated[int, Field(ge=0)] = 50
    """Save an HF checkpoint every N steps (0: not by steps). One is also saved at the end, on
    SIGTERM/SIGINT and when a training step fails (docs/operations.md)."""
    keep_checkpoints: Annotated[int, Field(ge=1)] = 3
    """Checkpoints kept in the run directory; older ones are deleted after each save."""
    checkpoint_minutes: Annotated[float, Field(ge=0, le=24 * 60)] = 10.0
    """Also save a checkpoint after a step when this many minutes passed since the last one
    (0: not by time), so a slow run loses at most this much work to a crash."""

    # --- algorithm (docs/off_policy.md, docs/adr/0007-learner-algorithms.md) ---
    algorithm: Literal[ALGORITHMS.names()] = "grpo"  # type: ignore[valid-type]  # the registered names
    """Advantage estimator. grpo: group-normalised episode reward; rloo: leave-one-out group
    baseline; reinforce_pp: return-to-go whitened over the batch (REINFORCE++); ppo: GAE with a
    learned critic (value_model)."""
    filter_groups: Literal["off", "equal", "solved"] = "off"
    """Dynamic sampling (DAPO, arXiv 2503.14476; learner/control/group_filter.py): under grpo and rloo a
    group whose episodes all got the same reward has advantage 0, so it can be played but not
    trained (ack and fate ``filtered``; its place under the staleness bound goes to another
    ticket), leaving every batch to groups that carry a signal. "equal": every such group (DAPO);
    "solved": only all-solved ones, so that all-failed groups still bring their KL term (which
    pulls back the tokens that failed). Near the end of learning most groups are all-solved:
    unfiltered, they dilute the batch and their KL term pulls the policy back to the reference with
    nothing against it. After ``STREAK_LIMIT`` x ``batch_groups`` filtered groups in a row the
    next group is trained anyway, so a solved task never stalls the run. grpo and rloo only
    (other estimators find a signal in such groups)."""
    loss_agg: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"] = "token_mean"
    """How per-token losses become one number: token_mean (every agent token weighs the same),
    seq_mean_token_mean (DeepSeekMath GRPO), seq_mean_token_sum_norm (Dr. GRPO: token sums over a
    constant, ``loss_norm_const``)."""
    loss_norm_const: Annotated[float, Field(gt=0)] | None = None
    """The constant of seq_mean_token_sum_norm (None: rollout.max_episode_tokens)."""
    tis_reject_above: Annotated[float, Field(gt=0)] | None = None
    """Tokens whose behaviour->proximal weight exceeds this get weight 0 instead of the cap
    (AReaL's rejection; None: off)."""
    staleness_decay: Annotated[float, Field(gt=0, le=1)] = 0.5
    """staleness_mode=downweight: a token s > max_staleness versions old weighs decay^(s - K)."""
    gamma: Annotated[float, Field(ge=0, le=1)] = 1.0
    """Discount per agent token (ppo, reinforce_pp)."""
    turn_discount: Annotated[float, Field(gt=0, le=1)] = 1.0
    """grpo and rloo with baseline = "turn": the outcome is discounted by this per agent turn
    between a turn and the episode's last one, for the episode and its cohort's baseline alike,
    so a success in fewer turns is credited more (1: every turn of an episode gets its outcome);
    with ``step_advantage_weight``, the step term's returns are discounted by it per turn too."""
    step_advantage_weight: Annotated[float, Field(ge=0)] = 0.0
    """grpo, rloo and reinforce_pp: add this times the step-relative advantage of the turns that
    acted on the same observation within a group (GiGPO's anchor states, learner/algorithms/step_groups.py),
    their returns discounted by ``turn_discount`` per turn. 0: off. Multi-turn envs whose episodes revisit
    states (maze, BabyAI, TextCraft): a move's credit then comes from what followed it from that
    state, not from the whole episode's outcome alone. GiGPO used 1 with a discount of 0.95."""
    negative_advantage_scale: Annotated[float, Field(ge=0, le=1)] = 1.0
    """Negative advantages are multiplied by this (1: the estimator's advantages as they are; 0:
    only tokens that did better than their baseline are trained, a filtered, advantage-weighted
    behaviour cloning of the policy's own samples). A small model's output layer spreads the
    probability a negative advantage takes off a sampled token over its whole vocabulary, tokens
    that are not actions among it; with 0 nothing is ever pushed down and the policy moves only
    toward what it did well (docs/results.md, "How the rows learn")."""
    gae_lambda: Annotated[float, Field(ge=0, le=1)] = 0.95
    """GAE's lambda (ppo)."""
    truncation: Literal["bootstrap", "terminal"] = "bootstrap"
    """ppo, for an episode cut by the turn limit: bootstrap (its return after the cut is V of the
    state it was cut in: the task goes on, as under ScalingInter-RL's growing limit) or terminal
    (nothing follows the cut, as for an agent judged by success within the limit). With gamma = 1
    and tasks an agent eventually solves, bootstrap drives V towards 1 everywhere and success
    within the limit stops paying: use gamma < 1 or terminal (docs/off_policy.md)."""
    whiten_advantages: bool = True
    """ppo: whiten the GAE advantages over the batch's agent tokens."""
    value_coef: Annotated[float, Field(ge=0)] = 0.5
    """ppo: weight of the value loss in the total loss."""
    value_lr: Annotated[float, Field(gt=0)] | None = None
    """ppo: learning rate of the critic (None: learner.lr), scaled by the same schedule. A shared
    head reads a representation every policy step moves; a faster head keeps up with it."""
    value_model: Literal["shared", "separate"] = "shared"
    """ppo: the critic. shared: a linear value head on the policy's last hidden state (the value
    loss also trains the policy's body). separate: a copy of the policy's transformer body from
    model.path with its own value head, trained only by the value loss at value_lr, its gradient
    clipped on its own, never sent to actors, saved in checkpoints; one more forward and backward
    per micro-batch and a second model's memory (learner/model/value_model.py, docs/off_policy.md)."""
    value_clip: Annotated[float, Field(gt=0)] | None = 0.2
    """ppo: clip range of the value loss around the values at the start of the step (None: off)."""
    kl_coef: Annotated[float, Field(ge=0)] = 0.0
    """Weight of KL(pi_theta || pi_ref) to the frozen initial model (0: no reference is loaded)."""
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    """Per-token KL estimator (Schulman 2020); k3 is unbiased, low variance and >= 0."""
    kl_mode: Literal["loss", "reward"] = "loss"
    """loss: kl_coef * KL is added to the loss; reward: -kl_coef * KL (of the proximal policy) is
    added to each agent token's reward before the advantages."""
    entropy_coef: Annotated[float, Field(ge=0)] = 0.0
    """Entropy bonus: loss -= entropy_coef * entropy of the sampling distribution."""
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"
    """LR after warm-up, over run.max_steps learner steps, down to lr * min_lr_ratio."""
    warmup_steps: Annotated[int, Field(ge=0)] = 0
    """Learner steps of linear LR warm-up (step s uses lr * (s + 1) / warmup_steps)."""
    min_lr_ratio: Annotated[float, Field(ge=0, le=1)] = 0.0
    """Final LR of the linear/cosine schedule as a fraction of lr."""
    micro_batch_tokens: Annotated[int, Field(ge=1)] | None = None
    """Gradient accumulation: a micro-batch holds rows whose padded size (rows x longest row)
    stays within this many tokens (a longer row goes alone). None: one pass per minibatch."""
    shared_prefix: bool = True
    """Run a group's shared prompt once: the rows of a group in a micro-batch are packed into one
    row (their common prefix, then each row's own tokens) under a prefix-tree attention mask,
    when the model's cost estimate says that is cheaper (learner/model/shared_prefix.py). The same
    logprobs and gradients up to float rounding. Not with PPO (its critic reads every position)."""

    # --- devices and data parallelism (docs/adr/0007-learner-algorithms.md) ---
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Training device; auto: cuda if available, else cpu."""
    bf16_autocast: bool = False
    """Run forward passes under bfloat16 autocast; weights, gradients and the optimizer stay
    float32 and logprobs are taken in float32. Meant for GPUs and for CPUs with bfloat16 units
    (AVX512-BF16, AMX); on others it runs, slowly, which is how CI tests the path. A model.dtype
    of bfloat16 with param_dtype float32 turns it on by itself (mixed precision)."""
    param_dtype: Literal["float32", "model"] = "float32"
    """The dtype of the learner's weights, gradients and AdamW state. float32: master weights in
    float32 whatever model.dtype is; with model.dtype bfloat16 the forward and backward run under
    bfloat16 autocast (mixed precision), the engines and the wire carry bfloat16. model: the
    learner holds model.dtype throughout (half the memory; bfloat16 weights cannot take an
    update smaller than about 1/256 of their size, so a small lr moves nothing)."""
    dp_size: Annotated[int, Field(ge=1)] = 1
    """Data-parallel ranks. Rank 0 is the learner process; it starts ranks 1.. as local
    processes (gloo on CPU, NCCL on GPU, one GPU per rank) and sends each step's batch to them."""
    dp_mode: Literal["replicate", "fsdp"] = "replicate"
    """How dp ranks hold the model. replicate: every rank holds all weights and optimizer state
    and the gradients are all-reduced (DDP). fsdp: weights, gradients and optimizer state are
    sharded over the ranks (torch FSDP2, one shard group per decoder layer), for models whose
    training state does not fit one device. Both take the same optimizer steps; with
    dp_size = 1 there is nothing to shard and fsdp trains like replicate."""
    dist_timeout_s: Annotated[float, Field(gt=0)] = 600.0
    """Deadline of every collective between data-parallel ranks."""
    dual_clip: Annotated[float, Field(gt=1)] | None = 3.0
    """Dual-clip PPO's c (verl's and AReaL's clip_ratio_c): a token with a negative advantage
    contributes at most c * |A| however far its ratio pi_theta/pi_prox has grown (None: off).
    Acts only with several optimizer steps per batch (minibatches or epochs > 1; with one, the ratio is 1)."""
    importance_baseline: bool = True
    """grpo/rloo on stale rows: each group's advantages are re-centred on the baseline estimated
    under pi_prox (self-normalised importance weights), so the weights add no net push up or down
    the group's sampled tokens (learner/algorithms/advantages.py: importance_recentred). No effect on fresh data."""
    behav_clip: bool = False
    """A stale token whose pi_prox/mu has already left [1 - clip_low, 1 + clip_high] in the direction
    its advantage asks for gets no gradient: the steps taken since it was sampled already did what it
    asks (PPO's clip, tested against the sampling policy). Never binds on fresh data (sync)."""
    secret_key: Path | None = None
    """CURVE: the learner's key pair file (DIR/learner.key_secret from ``agentgym keys DIR``). With
    ``authorized_keys``, both ports admit only allow-listed actors, and traffic is encrypted."""
    authorized_keys: Path | None = None
    """CURVE: directory of the admitted actors' public keys (DIR/authorized); re-read when it
    changes, so an actor can be added by copying its .key file there."""
    insecure: bool = False
    """Allow binding a non-loopback address without CURVE keys (anyone who reaches the ports can register, submit rollouts and download the weights)."""
    weight_dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """dtype the weights travel in to the actors (auto: model.dtype, the engines' dtype; an
    engine converts anything else on load). bfloat16 halves a float32 model's update bytes at
    bfloat16 precision (docs/adr/0011-weight-transfer.md)."""
    gradient_checkpointing: bool = False
    """Recompute each decoder layer's activations in the backward pass instead of keeping them:
    less memory for long sequences, about one more forward pass of compute."""
    lora: LoraConfig = LoraConfig()
    """LoRA adapters instead of full fine-tuning (off while lora.rank = 0)."""
    dist_init_addr: str | None = None
    """Rendezvous of learner ranks started on several hosts (tcp://HOST:PORT of rank 0), with
    RANK and WORLD_SIZE in each rank's environment as torchrun sets them. None: torchrun's
    MASTER_ADDR/MASTER_PORT when WORLD_SIZE is set, else ranks are spawned locally (dp_size)."""

    @model_validator(mode="after")
    def _lora_and_ranks(self) -> LearnerConfig:
        if self.filter_groups != "off" and self.algorithm not in GROUP_RELATIVE_ALGORITHMS:
            raise ValueError(
                f"learner.filter_groups needs learner.algorithm in {GROUP_RELATIVE_ALGORITHMS}, not {self.algorithm!r} "
                "(its advantages are not relative to the group, so an all-equal group still carries a signal)"
            )
        if self.step_advantage_weight > 0 and self.algorithm not in STEP_TERM_ALGORITHMS:
            raise ValueError(
                f"learner.step_advantage_weight needs learner.algorithm in {STEP_TERM_ALGORITHMS}, not "
                f"{self.algorithm!r} (ppo's critic is a baseline of each state already)"
            )
        if ALGORITHMS.get(self.algorithm).critic and self.value_model == "separate" and self.dp_mode == "fsdp":
            raise ValueError(
                "learner.value_model = 'separate' needs learner.dp_mode = 'replicate' "
                "(sharding the separate critic with fsdp is not supported)"
            )
        if self.lora.rank > 0 and self.dp_mode == "fsdp":
            raise ValueError(
                "learner.lora needs learner.dp_mode = 'replicate' (the adapters are small; "
                "sharding them is not supported)"
            )
        a = self.dist_init_addr
        if a is not None and (not a.startswith("tcp://") or not a.rsplit(":", 1)[-1].isdigit()):
            raise ValueError(f"learner.dist_init_addr must be tcp://HOST:PORT, got {a!r}")
        return self

    @model_validator(mode="after")
    def _deadlines(self) -> LearnerConfig:
        if self.ticket_deadline_min_s > self.ticket_deadline_max_s:
            raise ValueError(
                f"learner.ticket_deadline_min_s ({self.ticket_deadline_min_s}) must not exceed "
                f"learner.ticket_deadline_max_s ({self.ticket_deadline_max_s})"
            )
        return self

    @model_validator(mode="after")
    def _ports(self) -> LearnerConfig:
        check_tcp(self.bind, "learner.bind")  # a fixed port: the weight server binds the next one
        return self
