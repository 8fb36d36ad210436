"""Evaluation metrics, the one definition the learner's held-out rounds (``eval.jsonl``) and
``agentgym eval`` (its play loop in ``agentgym/cli/eval.py``) both import; it imports neither.

    pass_at_k(n=8, c=3, k=1)                      # unbiased estimator (Chen et al., 2021)
    summarize({"maze": [[True, False], [False, False]]}, k=2)
    summarize_groups([[True, False], [False, False]], k=2)    # the learner's, over groups

Definitions (docs/adr/0015-evaluation.md), the same in ``agentgym eval`` and in the learner's
``eval.jsonl``: a task is played ``n`` times; ``avg@k`` is the mean success over all its samples
(the expected pass@1) and ``pass@k`` is the unbiased estimate of the chance that at least one of
``k`` samples drawn from the ``n`` succeeds, ``1 - C(n-c, k) / C(n, k)``; both are averaged over
tasks. Reproducibility: every episode gets a seed derived from (seed, env, task, sample) only, and
every turn of it ``seed + turn``; engines honour per-request seeds, so the numbers do not depend
on how requests interleave.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from math import comb


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``c`` succeeded: 1 - C(n-c, k) / C(n, k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k: need 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def summarize(results: Mapping[str, Sequence[Sequence[bool]]], k: int) -> dict[str, dict[str, float]]:
    """Per env: tasks, samples, avg@k and pass@k (k <= samples per task) from success per sample,
    ``results[env][task][sample]``. Tasks with fewer than ``k`` samples are an error, not skipped."""
    out: dict[str, dict[str, float]] = {}
    for env, tasks in sorted(results.items()):
        if not tasks:
            raise ValueError(f"summarize: env {env!r} has no tasks")
        short = [i for i, s in enumerate(tasks) if len(s) < k]
        if short:
            raise ValueError(f"summarize: env {env!r} tasks {short[:5]} have fewer than k={k} samples")
        avg = sum(sum(s) / len(s) for s in tasks) / len(tasks)
        pk = sum(pass_at_k(len(s), sum(s), k) for s in tasks) / len(tasks)
        out[env] = {"tasks": len(tasks), "samples": sum(len(s) for s in tasks), f"avg@{k}": avg, f"pass@{k}": pk}
    return out


def summarize_groups(groups: Sequence[Sequence[bool]], k: int) -> dict[str, float]:
    """avg@k and pass@k over groups (one group = one task) for the learner's ``eval.jsonl``;
    groups that lost samples to env failures (fewer than ``k``) are left out."""
    full = [g for g in groups if len(g) >= k]
    return summarize({"all": full}, k)["all"] if full else {}


def episode_seed(seed: int, env: str, task: int, sample: int) -> int:
    """A 31-bit seed from the episode's identity only (vLLM takes a signed 32-bit seed)."""
    h = hashlib.blake2b(f"{seed}:{env}:{task}:{sample}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") & 0x3FFF_FFFF  # room for + turn below 2**31
