"""Held-out evaluation rounds inside a training run: one per weight version, played by the actors.

    evals = Evaluations(cfg, sched, eval_metrics, episode_log)
    rnd = evals.start(step, version)        # queues the round's tickets (then grant them)
    if evals.owns(rollout.group_id): evals.record(rollout)   # the last one writes eval.jsonl
    await rnd.done.wait()

A round's tickets are the first ``eval.tasks`` tasks of ``eval.split`` of every env, pinned to
weights of at least its version; the scheduler hands them out before new training work, outside
the staleness rule. Its record uses the definitions of ``agentgym eval`` (avg@k and pass@k with
k = ``rollout.group_size``; docs/adr/0015-evaluation.md).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import structlog
import trio

from agentgym.config import Config
from agentgym.learner.control.scheduler import Scheduler
from agentgym.learner.records.episode_log import EpisodeLog
from agentgym.learner.training.batch import trainable_episodes
from agentgym.observe.eval_metrics import summarize_groups
from agentgym.observe.logs import MetricsWriter
from agentgym.observe.sinks import SinkWriter
from agentgym.protocol import Rollout
from agentgym.protocol.arrays import I32, U8, unpack

log = structlog.get_logger(__name__)


def env_stats(batch: list[Rollout]) -> dict[str, float]:
    """Per-environment numbers of a batch, as flat ``env/<name>/<metric>`` keys: episodes, mean
    reward, success rate, mean agent turns, and the share of episodes cut by the turn limit."""
    by_env: dict[str, list] = {}
    for r in batch:
        by_env.setdefault(r.env, []).extend(trainable_episodes(r))
    out: dict[str, float] = {}
    for name, eps in sorted(by_env.items()):
        n = max(len(eps), 1)
        out[f"env/{name}/episodes"] = float(len(eps))
        out[f"env/{name}/reward_mean"] = sum(e.reward for e in eps) / n
        out[f"env/{name}/success_rate"] = sum(e.success for e in eps) / n
        out[f"env/{name}/turns_mean"] = sum(unpack(e.turn_ends, I32).size for e in eps) / n
        out[f"env/{name}/truncated_rate"] = sum(e.finish == "turn_limit" for e in eps) / n
    return out


@dataclass
class EvalRound:
    """One evaluation: its groups in flight and those back."""

    step: int
    version: int
    pending: set[str]
    rollouts: list[Rollout] = field(default_factory=list)
    done: trio.Event = field(default_factory=trio.Event)
    started: float = field(default_factory=time.monotonic)


class Evaluations:
    def __init__(
        self, cfg: Config, sched: Scheduler, metrics: MetricsWriter | SinkWriter, episode_log: EpisodeLog
    ) -> None:
        self.cfg = cfg
        self.sched = sched
        self.metrics = metrics
        self.episode_log = episode_log
        self.by_group: dict[str, EvalRound] = {}
        """Evaluation groups in flight -> their round."""
        self.by_version: dict[int, EvalRound] = {}
        self.results: list[dict[str, object]] = []
        """Every finished round's record, in order (summary.json lists them)."""

    def start(self, step: int, version: int) -> EvalRound:
        """Queue an evaluation of ``version`` (one per version: a second call returns the first)."""
        known = self.by_version.get(version)
        if known is not None:
            return known
        ec = self.cfg.eval
        tickets = self.sched.eval_round(version, ec.split, ec.tasks)
        rnd = EvalRound(step, version, {t.group_id for t in tickets})
        self.by_version[version] = rnd
        for t in tickets:
            self.by_group[t.group_id] = rnd
        log.info("eval_started", step=step, version=version, split=ec.split, groups=len(tickets))
        return rnd

    def owns(self, group_id: str) -> bool:
        return group_id in self.by_group

    def record(self, r: Rollout) -> None:
        """One evaluation group is back (with no episodes if it was invalid); the round's last
        one writes its record to eval.jsonl and the episode log."""
        rnd = self.by_group.pop(r.group_id)
        rnd.pending.discard(r.group_id)
        rnd.rollouts.append(r)
        if rnd.pending:
            return
        eps = [e for x in rnd.rollouts for e in trainable_episodes(x)]
        n = max(len(eps), 1)
        versions = [unpack(e.versions, I32)[unpack(e.loss_mask, U8) > 0] for e in eps]
        used = [int(v.min()) for v in versions if v.size] + [int(v.max()) for v in versions if v.size]
        rec: dict[str, Any] = {
            "step": rnd.step,
            "version": rnd.version,
            "split": self.cfg.eval.split,
            "episodes": len(eps),
            "success_rate": sum(e.success for e in eps) / n,
            "reward_mean": sum(e.reward for e in eps) / n,
            "env_failures": sum(len(x.episodes) for x in rnd.rollouts) - len(eps),
            "versions_used": [min(used, default=-1), max(used, default=-1)],
            # Same definitions as `agentgym eval` (agentgym/observe/eval_metrics.py), k = group_size; `pinned`:
            # every sampled token came from the evaluated version (docs/adr/0015-evaluation.md).
            **summarize_groups(
                [[e.success for e in trainable_episodes(x)] for x in rnd.rollouts], self.cfg.rollout.group_size
            ),
            "pinned": bool(used) and set(used) == {rnd.version},
            "seconds": time.monotonic() - rnd.started,
            **env_stats(rnd.rollouts),
        }
        self.metrics.write(rec)
        self.episode_log.write("eval", rnd.step, rnd.version, rnd.rollouts)
        self.results.append(rec)
        log.info(
            "eval",
            step=rnd.step,
            version=rnd.version,
            split=rec["split"],
            episodes=len(eps),
            success_rate=round(float(rec["success_rate"]), 3),
            reward_mean=round(float(rec["reward_mean"]), 3),
            seconds=round(float(rec["seconds"]), 1),
        )
        rnd.done.set()
