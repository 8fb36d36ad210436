"""The staleness rule, in one place: which tickets may be issued, which rollouts are trainable,
in what order buffered groups are trained, and how much each token weighs.

    rule = StalenessRule.from_config(cfg)
    rule.min_version(live, version)        # a new ticket's min_version, or None: not now
    rule.verdict(oldest, newest, version)  # "accepted" | "stale" for an arriving group
    buf = TrainBuffer(rule); buf.add(r); batch, dead = buf.take(batch_groups, version)
    rule.token_weights(versions, version)  # the trainer's per-token factor

The scheduler asks it before every new ticket, the learner's control loop on every rollout, the
train loop for every batch and the trainer for every token. Nothing else in the learner looks at
``run.mode`` or ``learner.max_staleness`` to decide what is trained (docs/adr/0013-staleness.md).

The rule (K = max_staleness, B = batch_groups; a token's staleness is the learner version it is
trained at minus the version of the weights that sampled it):

- async admission: a ticket is the (live+1)-th group not yet trained, counted over tickets still
  in play or buffered (``live``); trained oldest-first, it lands in the batch ``live // B`` steps
  from now, so it is issued only while ``live // B <= K``, and with ``min_version = version +
  live // B - K``: the actor plays it with weights at least that new (it waits for the update it
  is already fetching), so its tokens are at most K old when trained. Without the min_version an
  actor that lags the learner by L versions adds L to every token's staleness (measured: tokens
  5-8 versions old at K = 2 before this bound was put on tickets).
- sync admission: after publishing version v exactly B tickets are issued, to be played with
  weights >= v; a forfeited one is replaced.
- arrival (async): a group is refused ("stale") only when none of its agent tokens is within K,
  i.e. nothing in it could be trained. A long episode whose first turns were sampled more than
  K versions ago is trained on its later turns (sampled after a weight update) instead of
  being thrown away, with its over-K tokens weighted by ``staleness_mode`` (0 for drop). The
  bound on what is trained is per token, as the trainer always applied it.
- buffer: earliest deadline first. A group's deadline is its oldest token's version + K, so the
  group with the most at-risk tokens is trained first, and a group expires only when nothing in
  it is within K any more.
- sync (everything): only groups played entirely with the current weights are accepted.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from agentgym.protocol import Rollout

if TYPE_CHECKING:
    from torch import Tensor

    from agentgym.config import Config

Verdict = Literal["accepted", "stale"]


@dataclass
class StalenessRule:
    mode: Literal["async", "sync"]
    max_staleness: int
    batch_groups: int
    token_mode: Literal["drop", "downweight"] = "downweight"  # learner.staleness_mode's default
    decay: float = 0.5
    _round_version: int = -1
    _round_left: int = 0
    _carried: int = 0

    @classmethod
    def from_config(cls, cfg: Config) -> StalenessRule:
        lc = cfg.learner
        return cls(
            mode=cfg.run.mode,
            max_staleness=lc.max_staleness,
            batch_groups=lc.batch_groups,
            token_mode=lc.staleness_mode,
            decay=lc.staleness_decay,
        )

    @property
    def pipeline(self) -> int:
        """The most training tickets live at once (issued, neither trained nor forfeited):
        B·(K+1) in async mode, B in sync mode. The learner's socket bounds size by it too
        (learner/control/bounds.py)."""
        return self.batch_groups * (self.max_staleness + 1) if self.mode == "async" else self.batch_groups

    # ------------------------------------------------------------------ admission
    def on_version(self, version: int) -> None:
        """A new version is published: sync mode opens its round of B tickets for it, less the
        tickets of an earlier learner life that play in it (``on_reissue``)."""
        if self.mode == "sync":
            carried = min(self._carried, self.batch_groups)
            self._carried -= carried
            self._round_version, self._round_left = version, self.batch_groups - carried

    def on_reissue(self, n: int) -> None:
        """After a learner restart, ``n`` training tickets of its earlier life go out again. Async
        counts them in ``live`` (the scheduler does); sync fills its next rounds with them first."""
        self._carried = n

    def min_version(self, live: int, version: int) -> int | None:
        """The ``min_version`` of a new training ticket, or None while the rule admits none.
        ``live``: training tickets issued and neither trained nor forfeited; ``version``: the
        learner's version now."""
        if self.mode == "sync":
            if self._round_version < 0 or self._round_left <= 0:
                return None
            self._round_left -= 1
            return self._round_version
        ahead = live // self.batch_groups
        if ahead > self.max_staleness:
            return None
        # Trained at version + ahead, its tokens must be sampled by weights >= that - K. The
        # bound is <= version: an actor behind it fetches the published weights and plays.
        return max(-1, version + ahead - self.max_staleness)

    def headroom(self, live: int) -> int:
        """How many more training tickets the rule would issue now (what actors may grow into)."""
        if self.mode == "sync":
            return max(self._round_left, 0) if self._round_version >= 0 else 0
        return max(0, self.pipeline - live)

    def on_forfeit(self) -> None:
        """A training ticket will never be trained: a sync round needs one more."""
        if self.mode == "sync" and self._round_version >= 0:
            self._round_left += 1

    # ------------------------------------------------------------------ arrival and buffer
    def verdict(self, oldest: int, newest: int, version: int) -> Verdict:
        """A group whose agent tokens span versions [oldest, newest] arrives at ``version``."""
        if newest > version:
            # Weights this learner never had (it resumed from an earlier checkpoint than the
            # actor's weights): staleness would be negative, so the group is not trainable.
            return "stale"
        if self.mode == "sync":
            return "accepted" if oldest >= version else "stale"
        return "stale" if self.dead(newest, version) else "accepted"

    def dead(self, newest: int, version: int) -> bool:
        """Nothing of a group whose newest agent token is from ``newest`` is trainable at ``version``."""
        return self.token_mode == "drop" and version - newest > self.max_staleness

    def token_weights(self, token_versions: Tensor, version: int) -> Tensor:
        """Per-token factor for the loss (1 within K; beyond it 0 or decay^(s-K))."""
        from agentgym.learner.algorithms.losses import staleness_weights  # torch: only where tokens are weighed

        return staleness_weights(token_versions, version, self.max_staleness, mode=self.token_mode, decay=self.decay)


@dataclass(order=True)
class _Entry:
    deadline: int
    seq: int
    newest: int = field(compare=False)
    rollout: Rollout = field(compare=False)


class TrainBuffer:
    """Accepted groups waiting to be trained, earliest deadline first (see the module docstring)."""

    def __init__(self, rule: StalenessRule) -> None:
        self.rule = rule
        self._heap: list[_Entry] = []
        self._seq = itertools.count()

    def add(self, r: Rollout, oldest: int, newest: int) -> None:
        heapq.heappush(self._heap, _Entry(oldest + self.rule.max_staleness, next(self._seq), newest, r))

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self):
        return (e.rollout for e in sorted(self._heap))

    def expire(self, version: int) -> list[Rollout]:
        """Remove and return the groups with nothing trainable left at ``version``."""
        dead = [e for e in self._heap if self.rule.dead(e.newest, version)]
        if dead:
            self._heap = [e for e in self._heap if not self.rule.dead(e.newest, version)]
            heapq.heapify(self._heap)
        return [e.rollout for e in sorted(dead)]

    def take(self, n: int) -> list[Rollout]:
        """The ``n`` groups with the earliest deadlines (fewer if fewer are buffered)."""
        return [heapq.heappop(self._heap).rollout for _ in range(min(n, len(self._heap)))]


class StalenessTally:
    """Trained agent tokens by staleness over the whole run, from each step's histogram
    (the trainer's ``staleness_frac_<s>`` / ``staleness_frac_gt<K>``), for summary.json."""

    def __init__(self, max_staleness: int) -> None:
        self.K = max_staleness
        self.tokens: dict[str, float] = {}
        self.max = 0

    def add(self, stats: dict[str, float]) -> None:
        n = stats.get("agent_tokens", 0.0)
        for key, frac in stats.items():
            if key.startswith("staleness_frac_"):
                bucket = key.removeprefix("staleness_frac_").replace("gt", ">")
                self.tokens[bucket] = self.tokens.get(bucket, 0.0) + frac * n
        self.max = max(self.max, int(stats.get("staleness_max", 0)))

    def summary(self) -> dict[str, object]:
        total = sum(self.tokens.values())
        over = self.tokens.get(f">{self.K}", 0.0)
        return {
            "max_staleness": self.K,
            "tokens": {k: round(v) for k, v in self.tokens.items()},
            "over_bound_share": round(over / total, 5) if total else 0.0,
            "max_seen": self.max,
        }
