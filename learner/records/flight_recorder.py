"""The flight recorder: do the actors serve the weights the learner exported?

    fr = FlightRecorder(refuse=cfg.learner.refuse_digest_mismatch)
    fr.exported(version, digest)              # Learner.publish, per version (the chunks' digest)
    fr.report(actor_id, version, digest)      # each actor Heartbeat that carries a digest
    fr.refused(actor_id, oldest, newest)      # True: refuse this rollout (only with refuse on)
    fr.metrics(); fr.summary()                # metrics.jsonl, summary.json

After each weight update an actor reports ``protocol.weights.weights_digest`` of what its
engine serves: the parameters read back where the engine allows it (HF engine), else the tensors
as handed to the engine (vLLM, sim). The learner compares it with the digest of its own export
of that version. A mismatch (a tensor skipped, mis-copied, converted wrongly, an update that
never reached the engine) is logged as an error, counted, and raises the alarm; with
``learner.refuse_digest_mismatch`` the actor's rollouts sampled with that version are answered
``invalid`` (reason ``weights_digest_mismatch``). Versions are checked once per actor; the last
``KEEP`` exports are remembered (a report of an older one is counted unchecked).

``LogprobAgreement`` watches the other half, per actor: after each training step, the mean k3
KL between the behaviour logprobs each actor reported for its trained groups and the learner's
own at the batch start (the trainer's ``group_mismatch_kl``: the same mismatch its importance
weights correct). A buggy engine, a mis-applied update and a forging actor all show there
first. That KL also holds the policy's own drift since the group's version (0.1-0.25 per token
early in a healthy quickstart at lr 1e-2, its groups 1-2 versions old), so an actor is compared
only with groups of the same lag (learner version minus the group's oldest): its mean over a
step's groups of one lag is flagged when it exceeds ``learner.logprob_outlier_kl`` and
``OUTLIER_FACTOR`` times the median of the OTHER actors' means at that lag, and that median
by more than the threshold (a difference of drift between a few groups is not an outlier). With no other actor
at that lag, only lag 0 is judged (no drift: against ``OUTLIER_FACTOR`` times the threshold); a
lone actor's older groups cannot be told from drift. Flagged: logged (``logprob_outlier``),
counted once per actor and step, in metrics and summary.json; every step's per-actor means are
in the JSON log (``logprob_agreement``, debug).
"""

from __future__ import annotations

from collections import Counter

import structlog

log = structlog.get_logger(__name__)


class FlightRecorder:
    KEEP = 16
    """Export digests remembered (versions); bounded whatever the run's length."""

    def __init__(self, refuse: bool = False) -> None:
        self.refuse = refuse
        self._exports: dict[int, int] = {}
        self._checked: dict[str, int] = {}
        """Actor id -> the newest version whose report was compared."""
        self.bad: dict[str, set[int]] = {}
        """Actor id -> versions it served with a wrong digest (the last KEEP)."""
        self.counts: Counter[str] = Counter()
        self.mismatched: Counter[str] = Counter()
        """Per actor, versions reported with a wrong digest (for summary.json)."""

    def exported(self, version: int, digest: int) -> None:
        self._exports[version] = digest
        for v in [v for v in self._exports if v <= version - self.KEEP]:
            del self._exports[v]

    def report(self, actor_id: str, version: int, digest: int) -> bool | None:
        """An actor serves ``version`` with ``digest``: True if it matches the export, False if
        not (logged, counted, alarmed), None if already checked or not comparable."""
        if digest < 0 or self._checked.get(actor_id, -1) >= version:
            return None
        self._checked[actor_id] = version
        want = self._exports.get(version)
        if want is None or want < 0:
            self.counts["unchecked"] += 1
            return None
        if digest == want:
            self.counts["match"] += 1
            return True
        self.counts["mismatch"] += 1
        self.mismatched[actor_id] += 1
        bad = self.bad.setdefault(actor_id, set())
        bad.add(version)
        for v in sorted(bad)[: -self.KEEP]:
            bad.discard(v)
        log.error(
            "weights_digest_mismatch",
            actor_id=actor_id,
            version=version,
            served=digest,
            exported=want,
            refused=self.refuse,
            alarm=True,
        )
        return False

    def refused(self, actor_id: str, oldest: int, newest: int) -> bool:
        """With refusal on: whether a rollout of ``actor_id`` sampled with versions in
        [oldest, newest] used weights it served wrongly."""
        bad = self.bad.get(actor_id)
        return self.refuse and bad is not None and any(oldest <= v <= newest for v in bad)

    def forget(self, actor_id: str) -> None:
        """An actor left: its check state goes (its mismatch count stays in the summary)."""
        self._checked.pop(actor_id, None)
        self.bad.pop(actor_id, None)

    @property
    def alarm(self) -> bool:
        return self.counts["mismatch"] > 0

    def metrics(self) -> dict[str, int]:
        return {
            "weights_digest_match": self.counts["match"],
            "weights_digest_mismatch": self.counts["mismatch"],
            "weights_digest_unchecked": self.counts["unchecked"],
        }

    def summary(self) -> dict[str, object]:
        return {**self.metrics(), "alarm": self.alarm, "mismatched_actors": dict(self.mismatched)}


def _median(xs: list[float]) -> float:
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


class LogprobAgreement:
    OUTLIER_FACTOR = 4.0

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold
        self.kl: dict[str, tuple[float, int]] = {}
        """Actor id -> (sum of its groups' mean KL, groups), over the run."""
        self.flagged: Counter[str] = Counter()
        """Actor id -> steps in which it was flagged."""
        self.last: dict[str, float] = {}
        """Actor id -> its mean KL in the last step it had groups in."""

    def observe(self, step: int, groups: list[tuple[str, int, float]]) -> list[str]:
        """A step's trained groups as (actor id, lag in versions, mean KL; < 0: no token
        measured); returns the actors flagged in it."""
        per: dict[str, list[float]] = {}
        by_lag: dict[int, dict[str, list[float]]] = {}
        for actor, lag, kl in groups:
            if kl >= 0:
                per.setdefault(actor, []).append(kl)
                by_lag.setdefault(max(0, lag), {}).setdefault(actor, []).append(kl)
        for a, v in per.items():
            total, n = self.kl.get(a, (0.0, 0))
            self.kl[a] = (total + sum(v), n + len(v))
        self.last.update({a: sum(v) / len(v) for a, v in per.items()})
        out: dict[str, tuple[int, float, float | None]] = {}
        for lag, actors in sorted(by_lag.items()):
            means = {a: sum(v) / len(v) for a, v in actors.items()}
            log.debug("logprob_agreement", step=step, lag=lag, means={a: round(m, 5) for a, m in means.items()})
            for a, m in means.items():
                others = sorted(x for b, x in means.items() if b != a)
                ref = _median(others) if others else (self.threshold if lag == 0 else None)
                # OUTLIER_FACTOR times the reference, and above it by more than the threshold: two
                # healthy actors' means of a few groups at one lag differ by their groups' drift
                # alone (0.057 against 0.013 at lag 2 in a healthy quickstart), which a ratio of
                # small numbers mistakes for an outlier.
                if ref is None or a in out:
                    continue
                if m > self.OUTLIER_FACTOR * ref and m - ref > self.threshold:
                    out[a] = (lag, m, _median(others) if others else None)
        for a, (lag, m, median) in out.items():
            self.flagged[a] += 1
            log.warning(
                "logprob_outlier",
                actor_id=a,
                step=step,
                lag=lag,
                mismatch_kl=round(m, 5),
                others_median=None if median is None else round(median, 5),
                threshold=self.threshold,
            )
        return list(out)

    def metrics(self) -> dict[str, float]:
        return {
            "logprob_mismatch_kl_max": max(self.last.values(), default=0.0),
            "logprob_outliers": float(sum(self.flagged.values())),
        }

    def summary(self) -> dict[str, object]:
        return {
            a: {"mismatch_kl_mean": t / max(n, 1), "groups": n, "flagged_steps": self.flagged[a]}
            for a, (t, n) in sorted(self.kl.items())
        }
