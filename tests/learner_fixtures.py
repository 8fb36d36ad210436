"""Synthetic, deterministic learner data for the trainer tests: a one-step bandit in token form.

Every episode is ``prompt (env tokens) + one agent token + closing tokens (env)``; the agent token
is GOOD (reward 1) or BAD (reward 0). Nothing here is random unless a seed is passed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from agentgym.config import Config, load_config
from agentgym.learner.model.logprobs import sequence_logprobs
from agentgym.protocol import Episode, Rollout
from agentgym.protocol.arrays import F32, I32, U8, pack

GOOD, BAD = 40, 41
PROMPTS = ([1, 20, 21, 22, 2, 1, 23, 24], [1, 25, 26, 2, 1, 27, 28, 29, 30, 31])
CLOSING = [2, 10]


def make_cfg(model_dir: Path, *overrides: str) -> Config:
    # CPU: these tests check float32 results bit for bit and gloo ranks, whatever GPUs the host has.
    # allow_special_tokens: the synthetic episodes' behaviour logprobs (good_logprob) are of the
    # full softmax, so the trainer scores that one too (the ban itself: tests/test_logprobs.py).
    base = [
        f'model.path="{model_dir}"',
        "learner.lr=1e-2",
        "learner.threads=1",
        "rollout.temperature=1.0",
        "rollout.max_episode_tokens=64",
        "run.max_steps=10",
        'learner.device="cpu"',
        "rollout.allow_special_tokens=true",
    ]
    return load_config(None, [*base, *overrides])


def episode(
    prompt: list[int],
    agent: list[list[int]],
    rewards: list[float],
    *,
    version: int = 0,
    behav: list[float] | None = None,
    finish: str = "done",
    between: list[int] = CLOSING,
) -> Episode:
    """An episode of len(agent) turns: prompt, then each turn's agent tokens followed by ``between``."""
    ids, mask, ends = list(prompt), [0] * len(prompt), []
    for turn in agent:
        ids += turn
        mask += [1] * len(turn)
        ends.append(len(ids))
        ids += between
        mask += [0] * len(between)
    n = len(ids)
    m = np.array(mask, dtype=np.uint8)
    lp = np.zeros(n, dtype=np.float32)
    if behav is not None:
        lp[m == 1] = behav
    vers = np.where(m == 1, version, -1)
    return Episode(
        token_ids=pack(ids, I32),
        logprobs=pack(lp, F32),
        loss_mask=pack(m, U8),
        versions=pack(vers, I32),
        turn_ends=pack(ends, I32),
        turn_rewards=pack(rewards, F32),
        reward=float(sum(rewards)),
        success=sum(rewards) > 0,
        finish=finish,
        turn_limit=max(1, len(agent)),  # type: ignore[arg-type]  # finish: a str of EpisodeFinish's values
    )


def bandit_rollouts(model: torch.nn.Module | None = None, *, version: int = 0, group_size: int = 4) -> list[Rollout]:
    """Two groups (one per prompt), half GOOD half BAD; behaviour logprobs from ``model`` (the
    learner's own, so importance weights are exactly 1) or 0 without one."""
    out = []
    for gi, prompt in enumerate(PROMPTS):
        eps = []
        for i in range(group_size):
            tok = GOOD if i % 2 == 0 else BAD
            behav = [good_logprob(model, prompt, tok)] if model is not None else None
            eps.append(episode(prompt, [[tok]], [1.0 if tok == GOOD else 0.0], version=version, behav=behav))
        out.append(Rollout(group_id=f"g{gi}", actor_id="a", env="bandit", task_id=gi, episodes=eps))
    return out


def good_logprob(model: torch.nn.Module | None, prompt: list[int], tok: int = GOOD) -> float:
    """log π(tok | prompt) under ``model`` (float32, temperature 1)."""
    assert model is not None
    ids = torch.tensor([prompt + [tok]])
    with torch.no_grad():
        return float(sequence_logprobs(model, ids, torch.ones_like(ids))[0, -1])


def params_equal(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
