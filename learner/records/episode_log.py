"""What the agent did: a few episodes per step, decoded, in ``RUN_DIR/episodes.jsonl``.

    log = EpisodeLog(run_dir / "episodes.jsonl", model_dir, per_step=2)
    log.write("train", step, version, rollouts)    # after each optimizer step
    log.write("eval", step, version, rollouts)     # when an evaluation round completes

One JSON object per episode: where it came from (env, task, group, actor), how it ended (reward,
success, finish reason, turns, turn limit) and its token list cut into segments exactly as the
learner trains on it: the prompt, then each agent turn (loss-mask 1: the sampled tokens, with
their weight versions, mean behaviour logprob and the turn's reward) and each environment
message between turns (loss-mask 0), decoded with the model's tokenizer, special tokens kept so
the chat template is visible. ``agentgym view RUN_DIR`` turns the file into a page
(agentgym/observe/viewer.py).

Which episodes (:func:`pick_episodes`): one per group in turn, alternately the best and the worst
of its group, then a second pass taking the other one, so successes and failures both show.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from agentgym.observe.logs import MetricsWriter
from agentgym.protocol import Episode, Rollout
from agentgym.protocol.arrays import F32, I32, U8, unpack


def pick_episodes(rollouts: list[Rollout], n: int) -> list[tuple[Rollout, int]]:
    """Up to ``n`` (group, episode index) pairs, at most two per group: group g's j-th pick is
    its best episode when g + j is even, its worst otherwise (one pass over the groups already
    alternates), skipping a repeat (a group whose episodes all scored the same)."""
    out: list[tuple[Rollout, int]] = []
    groups = [r for r in rollouts if r.episodes]
    for k in range(2 * len(groups)):
        if len(out) >= n:
            break
        g, j = k % len(groups), k // len(groups)
        rewards = [e.reward for e in groups[g].episodes]
        i = int(np.argmax(rewards)) if (g + j) % 2 == 0 else int(np.argmin(rewards))
        if (groups[g], i) not in out:
            out.append((groups[g], i))
    return out


def segments(ep: Episode, decode: Any) -> list[dict[str, Any]]:
    """The episode's tokens as prompt / agent / env segments (maximal runs of one loss-mask
    value), each decoded with ``decode(list[int]) -> str``."""
    ids = unpack(ep.token_ids, I32)
    mask = unpack(ep.loss_mask, U8)
    behav = unpack(ep.logprobs, F32)
    vers = unpack(ep.versions, I32)
    turn_ends = unpack(ep.turn_ends, I32).tolist()
    turn_rewards = unpack(ep.turn_rewards, F32).tolist()
    out: list[dict[str, Any]] = []
    if ids.size == 0:
        return out
    cuts = np.flatnonzero(np.diff(mask.astype(np.int8))) + 1
    # Messages that carry a critique (critique in the loop) are segments of their own.
    spans = unpack(ep.critiques, I32).reshape(-1, 2).tolist()
    bounds = {b for span in spans for b in span if 0 < b < ids.size}
    cuts = np.unique(np.concatenate([cuts, np.asarray(sorted(bounds), dtype=cuts.dtype)]))
    for start, end in zip([0, *cuts.tolist()], [*cuts.tolist(), ids.size], strict=True):
        seg: dict[str, Any] = {"text": decode(ids[start:end].tolist()), "tokens": end - start}
        if mask[start]:
            seg["role"] = "agent"
            turn = turn_ends.index(end) if end in turn_ends else None
            seg["turn"] = turn
            seg["reward"] = turn_rewards[turn] if turn is not None and turn < len(turn_rewards) else None
            seg["versions"] = [int(vers[start:end].min()), int(vers[start:end].max())]
            seg["logprob_mean"] = float(behav[start:end].mean())
        else:
            critique = any(a <= start and end <= b for a, b in spans)
            seg["role"] = "critique" if critique else "prompt" if start == 0 else "env"
        out.append(seg)
    return out


def episode_record(kind: str, step: int, version: int, r: Rollout, i: int, decode: Any) -> dict[str, Any]:
    ep = r.episodes[i]
    return {
        "kind": kind,
        "step": step,
        "version": version,
        "env": r.env,
        "task_id": r.task_id,
        "group_id": r.group_id,
        "actor_id": r.actor_id,
        "episode": i,
        "group_size": len(r.episodes),
        "group_reward_mean": float(np.mean([e.reward for e in r.episodes])),
        "reward": ep.reward,
        "success": ep.success,
        "finish": ep.finish,
        "failure": ep.failure,
        "turns": len(unpack(ep.turn_ends, I32)),
        "turn_limit": ep.turn_limit,
        "tokens": len(unpack(ep.token_ids, I32)),
        "segments": segments(ep, decode),
        "critiques": len(unpack(ep.critiques, I32)) // 2,
    }


class EpisodeLog:
    """Appends :func:`episode_record` lines for ``per_step`` picked episodes per call."""

    def __init__(self, path: Path, tokenizer_dir: Path, per_step: int) -> None:
        self.path = Path(path)
        self.tokenizer_dir = Path(tokenizer_dir)
        self.per_step = per_step
        self._writer: MetricsWriter | None = None
        self._tok: Any = None

    def decode(self, ids: list[int]) -> str:
        if self._tok is None:
            from transformers import AutoTokenizer

            self._tok = AutoTokenizer.from_pretrained(self.tokenizer_dir)
        return str(self._tok.decode(ids, skip_special_tokens=False))

    def write(self, kind: str, step: int, version: int, rollouts: list[Rollout]) -> int:
        """Decode and append the picked episodes; returns how many were written."""
        if self.per_step <= 0:
            return 0
        if self._writer is None:
            self._writer = MetricsWriter(self.path)
        picked = pick_episodes(rollouts, self.per_step)
        for r, i in picked:
            self._writer.write(episode_record(kind, step, version, r, i, self.decode))
        return len(picked)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
