"""A base model for the demo: the tiny random model trained as a language model on random play.

    agentgym make-model --arch tiny --pretrain-steps 300 --pretrain-env guess_number models/tiny-base
    agentgym make-model --arch agent-small --pretrain-steps 1500 --pretrain-env mix models/agent-small-base
    [model] create_tiny = true, pretrain_steps = 300      # the same, when a run creates its model

A real run starts from a pretrained checkpoint, whose hidden state at the generation prompt
depends on what the prompt says. The tiny random model's does not: its last hidden state there
is the same vector whatever the observation, up to a few percent of its norm (docs/off_policy.md,
"The echo probe"), so a policy-gradient step moves every state's logits the same way, and RL
settles on one unconditional distribution over actions before it learns to read the
observation. This module gives the demo what a real checkpoint has: it plays the env (or a mix
of envs, each episode drawing its env by weight) with uniformly random actions
(``Env.random_action``: no good move is ever shown; an action is as many tokens as the
tokenizer makes of it) and trains the
model by next-token cross-entropy on every token of those transcripts, built exactly as actors
build them (``actors/play/conversation.Conversation``, the env's instructions as system message). To
predict the env's replies the model has to read the history (which hint follows a guess depends
on the hints before it); the actions it learns are the uniform ones. It is a tool for the demo
and the benchmarks; nothing in the actors or the learner depends on it.

The model is written to a temporary directory beside ``out_dir`` and renamed into place, so a
process that finds ``out_dir/config.json`` finds a whole model. ``pretrain.json`` in the model
directory records what it was trained on and its loss before and after.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import structlog

log = structlog.get_logger(__name__)

PRETRAIN_BATCH = 32
PRETRAIN_TURNS = 6


MIX = "mix"
"""``--pretrain-env mix``: the game envs of ``agentgym.models.agent.GAME_MIX``, equal weights."""

EnvMix = Sequence[tuple[str, dict[str, Any], float]]
"""(env name, its options, its weight) per env that random play draws episodes from."""


POLICIES = ("random", "expert")
"""What plays the transcripts: ``random`` (``Env.random_action``: the base model, the format and
never a good move) or ``expert`` (``Env.expert_action``: supervised fine-tuning on the env's
scripted expert, the results table's labelled "SFT on expert" rows, never the base of an RL row)."""


def random_play(
    tokenizer: Any,
    env: Any,
    task_id: int,
    turns: int,
    rng: random.Random,
    policy: str = "random",
    endings: bool = False,
    quiz: bool = False,
) -> list[int]:
    """Token ids of one episode of ``env`` played with ``env.random_action`` (or, with ``policy``
    "expert", ``env.expert_action``), as an actor builds them; with ``endings``, followed by the
    env's reply to the last action (an actor has no use for it: nothing is generated after it).
    With ``quiz``, a lost episode ends instead with the env's question about it and an agent turn
    that answers it (``Env.quiz``: Wordle's "What was the word?" and the word)."""
    from agentgym.actors.play.conversation import Conversation

    first = env.reset(task_id)  # before instructions(): some envs' instructions name the task
    conv = Conversation.start(tokenizer, env.instructions() or None, first)
    for _ in range(turns):
        action = env.expert_action() if policy == "expert" else env.random_action(rng)
        ids = tokenizer.encode(action, add_special_tokens=False)
        conv.add_agent_turn(ids, [0.0] * len(ids), 0)
        result = env.step(action)
        asked = env.quiz() if quiz and result.done else None
        if asked is not None:
            conv.add_observation(asked[0])
            ids = tokenizer.encode(asked[1], add_special_tokens=False)
            conv.add_agent_turn(ids, [0.0] * len(ids), 0)
        elif endings or not result.done:
            conv.add_observation(result.observation)
        if result.done:
            break
    return list(conv.token_ids)


def lm_loss(model: Any, episodes: list[list[int]], pad_id: int) -> Any:
    """Mean next-token cross-entropy over every real token of ``episodes`` (padding excluded)."""
    import torch

    width = max(len(e) for e in episodes)
    # int64 whatever the ids are: random play's are numpy int32, which torch keeps when no
    # transcript needs padding (all of one length), and cross-entropy refuses int32 targets.
    ids = torch.tensor([[int(t) for t in e] + [pad_id] * (width - len(e)) for e in episodes], dtype=torch.long)
    real = torch.tensor([[True] * len(e) + [False] * (width - len(e)) for e in episodes])
    # The output head only at real positions: padding is most of a mixed batch's width, and the
    # head (vocabulary x hidden) is the largest matrix of the small models. The rows are
    # right-padded, so no attention mask is needed (learner/model/logprobs.right_padded says why): the
    # attention runs on PyTorch's fused causal kernel.
    hidden = model.model(ids).last_hidden_state[:, :-1]
    keep = real[:, 1:]
    logits = model.lm_head(hidden[keep])
    return torch.nn.functional.cross_entropy(logits, ids[:, 1:][keep])


def mix_of(env_name: str, env_kwargs: dict[str, Any] | None = None) -> EnvMix:
    """The envs that ``env_name`` stands for: itself with ``env_kwargs``, or ``MIX``'s games."""
    if env_name == MIX:
        from agentgym.models.agent import GAME_MIX

        return list(GAME_MIX)
    return [(env_name, dict(env_kwargs or {}), 1.0)]


def _build_envs(mix: EnvMix, rng: random.Random, policy: str) -> list[Any]:
    from agentgym.envpool.registry import resolve_env

    envs = []
    for name, kwargs, _ in mix:
        env = resolve_env(name)(**kwargs)
        try:
            env.reset(0)
            env.expert_action() if policy == "expert" else env.random_action(rng)
        except NotImplementedError as e:
            raise ValueError(f"pretrain_on_play: env {name!r} cannot be pretrained on: {e}") from None
        envs.append(env)
    return envs


def pretrain_on_play(
    model_dir: Path,
    out_dir: Path,
    env_name: str | EnvMix,
    env_kwargs: dict[str, Any] | None = None,
    *,
    steps: int = 300,
    lr: float = 3e-3,
    seed: int = 0,
    turns: int = PRETRAIN_TURNS,
    policy: str = "random",
    endings: bool = False,
    quiz: bool = False,
) -> dict[str, Any]:
    """Train the model at ``model_dir`` on random play of ``env_name`` (an env's name, ``MIX``, or
    an ``EnvMix``), or on its expert's play with ``policy`` "expert" (``POLICIES``); write it to
    ``out_dir``. ``endings``: each transcript keeps the env's reply to its last action (how the
    game ended: Wordle's "the word was ..."), what a text of a whole game holds. ``quiz``: a lost
    game ends with the env's question about it, answered in the agent's turn (``random_play``).

    Returns the record also written to ``out_dir/pretrain.json``. ``model_dir`` may be ``out_dir``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if steps < 1:
        raise ValueError(f"pretrain_on_play: steps must be >= 1, got {steps}")
    if policy not in POLICIES:
        raise ValueError(f"pretrain_on_play: policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    mix = mix_of(env_name, env_kwargs) if isinstance(env_name, str) else list(env_name)
    rng = random.Random(seed)
    envs = _build_envs(mix, rng, policy)
    weights = [w for _, _, w in mix]

    # Training transcripts come from each env's train split, the held-out ones from its test split.
    splits = [{s: type(e).tasks(s, **k) for s in ("train", "test")} for e, (_, k, _) in zip(envs, mix)]

    def play(split: str, r: random.Random) -> list[int]:
        i = 0 if len(envs) == 1 else r.choices(range(len(envs)), weights)[0]
        ids = splits[i][split]
        return random_play(tokenizer, envs[i], ids[r.randrange(len(ids))], turns, r, policy, endings, quiz)

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
        # Held-out transcripts (task ids the training draw never reaches) measure the loss.
        probe = [play("test", random.Random(i)) for i in range(64)]
        with torch.no_grad():
            before = float(lm_loss(model, probe, pad_id))
        t0 = time.monotonic()
        for step in range(1, steps + 1):
            batch = [play("train", rng) for _ in range(PRETRAIN_BATCH)]
            loss = lm_loss(model, batch, pad_id)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            if step % 25 == 0 or step == steps:  # a 300-step pretraining takes 8-20 minutes here
                log.info(
                    "pretrain_progress",
                    step=step,
                    steps=steps,
                    loss=round(loss.item(), 4),
                    seconds=round(time.monotonic() - t0, 1),
                )
        with torch.no_grad():
            after = float(lm_loss(model, probe, pad_id))
    name = env_name if isinstance(env_name, str) else "+".join(n for n, _, _ in mix)
    record = {
        "env": name,
        "env_kwargs": dict(env_kwargs or {}),
        "mix": [[n, k, w] for n, k, w in mix],
        "steps": steps,
        "lr": lr,
        "seed": seed,
        "turns": turns,
        "policy": policy,
        "endings": endings,
        "quiz": quiz,
        "batch": PRETRAIN_BATCH,
        "heldout_loss_before": round(before, 4),
        "heldout_loss_after": round(after, 4),
        "seconds": round(time.monotonic() - t0, 1),
    }
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(f"{out_dir.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    if Path(model_dir, "generation_config.json").exists():
        shutil.copy(Path(model_dir, "generation_config.json"), tmp / "generation_config.json")
    (tmp / "pretrain.json").write_text(json.dumps(record, indent=1))
    if out_dir.exists():
        shutil.rmtree(out_dir)
    os.replace(tmp, out_dir)
    log.info("pretrained_on_play", path=str(out_dir), **record)
    return record


def pretrain_in_stages(
    model_dir: Path,
    out_dir: Path,
    env_name: str | EnvMix,
    env_kwargs: dict[str, Any] | None,
    *,
    steps: int,
    policy: str,
    sft_steps: int,
    seed: int,
    turns: int,
    endings: bool = False,
    quiz: bool = False,
) -> dict[str, Any]:
    """``pretrain_on_play``: ``steps`` of ``policy``'s play, then ``sft_steps`` of the expert's
    (``model.sft_steps``), each stage only if it has steps (at least one must). The model appears
    at ``out_dir`` after the last stage; its ``pretrain.json`` lists every stage under ``stages``
    when there are two."""
    stages = [(n, p) for n, p in ((steps, policy), (sft_steps, "expert")) if n]
    if not stages:
        raise ValueError("pretrain_in_stages: steps and sft_steps are both 0")
    records = []
    for i, (n, p) in enumerate(stages):
        last = i == len(stages) - 1
        records.append(
            pretrain_on_play(
                model_dir,
                out_dir if last else model_dir,
                env_name,
                env_kwargs,
                steps=n,
                seed=seed,
                turns=turns,
                policy=p,
                endings=endings,
                quiz=quiz,
            )
        )
    if len(records) > 1:
        (out_dir / "pretrain.json").write_text(json.dumps({**records[-1], "stages": records}, indent=1))
    return records[-1]


def ensure_model(cfg: Any) -> None:
    """With ``model.create_tiny``: make the demo model ``model.arch`` at ``model.path`` if it has
    none, then, with ``model.pretrain_steps``, pretrain it on random play of the run's envs (by
    their weights; their experts' play with ``model.pretrain_policy = "expert"``), and then, with
    ``model.sft_steps``, on their experts' play. With ``model.make_from``: the pretrained model from
    its package (agentgym/models/packaged.py). A model already there is left alone, whatever made it."""
    path = Path(cfg.model.path)
    if (path / "config.json").exists():
        return
    if cfg.model.make_from:
        from agentgym.models.packaged import make_from_package

        log.info("making_model", path=str(path), source=cfg.model.make_from)
        part = path.with_name(f"{path.name}.part-{os.getpid()}")  # renamed when whole: never half a model at path
        try:
            make_from_package(cfg.model.make_from, part)
            part.rename(path)
        finally:
            shutil.rmtree(part, ignore_errors=True)
        return
    if not cfg.model.create_tiny:
        return
    from agentgym.models.agent import make_agent_model
    from agentgym.models.tiny import make_default_tiny_model

    arch = cfg.model.arch

    def make(where: Path) -> None:
        if arch == "tiny":
            make_default_tiny_model(where, seed=cfg.run.seed)
        else:
            make_agent_model(where, arch, seed=cfg.run.seed)

    log.info(
        "creating_tiny_model",
        path=str(path),
        arch=arch,
        pretrain_steps=cfg.model.pretrain_steps,
        sft_steps=cfg.model.sft_steps,
    )
    if not (cfg.model.pretrain_steps or cfg.model.sft_steps):
        make(path)
        return
    raw = path.with_name(f"{path.name}.random-{os.getpid()}")
    make(raw)
    # The simulated latency of the benchmarks' waiting env would only slow the transcripts down;
    # model.pretrain_env_kwargs replaces the options the base is to be pretrained with otherwise.
    mix = [
        (
            s.name,
            {
                k: v
                for k, v in {**s.kwargs, **cfg.model.pretrain_env_kwargs}.items()
                if k not in ("step_latency_s", "latency_sigma")
            },
            s.weight,
        )
        for s in cfg.env.specs
    ]
    target: str | EnvMix = mix[0][0] if len(mix) == 1 else mix
    try:
        pretrain_in_stages(
            raw,
            path,
            target,
            mix[0][1] if len(mix) == 1 else None,
            steps=cfg.model.pretrain_steps,
            policy=cfg.model.pretrain_policy,
            sft_steps=cfg.model.sft_steps,
            seed=cfg.run.seed,
            turns=cfg.model.pretrain_turns,
            endings=cfg.model.pretrain_endings,
            quiz=cfg.model.pretrain_quiz,
        )
    finally:
        shutil.rmtree(raw, ignore_errors=True)
