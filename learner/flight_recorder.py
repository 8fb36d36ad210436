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
        log.error("weights_digest_mismatch", actor_id=actor_id, version=version, served=digest, exported=want,
                  refused=self.refuse, alarm=True)  # fmt: skip
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
        return {"weights_digest_match": self.counts["match"], "weights_digest_mismatch": self.counts["mismatch"],
                "weights_digest_unchecked": self.counts["unchecked"]}  # fmt: skip

    def summary(self) -> dict[str, object]:
        return {**self.metrics(), "alarm": self.alarm, "mismatched_actors": dict(self.mismatched)}
