"""Step progress for console lines: ``step N/total`` and the time left at the recent pace.

    clock = StepClock(total=cfg.run.max_steps)
    log.info("step", step=n, **clock.fields(n))      # progress="12/200" left="3m05s"

The pace is measured from the first step this process saw (a resumed run does not count the
steps of the earlier process as instant), over at most the last ``window`` steps.
"""

from __future__ import annotations

import time
from collections import deque


def fmt_seconds(s: float) -> str:
    """``3m05s``, ``1h02m``, ``42s``."""
    s = max(0, int(round(s)))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


class StepClock:
    def __init__(self, total: int, window: int = 20) -> None:
        self.total = total
        self._seen: deque[tuple[int, float]] = deque(maxlen=window + 1)

    def fields(self, step: int, now: float | None = None) -> dict[str, str]:
        """``progress`` (N/total) and, once two steps were seen, ``left`` (estimated time)."""
        now = time.monotonic() if now is None else now
        self._seen.append((step, now))
        out = {"progress": f"{step}/{self.total}"}
        (s0, t0), (s1, t1) = self._seen[0], self._seen[-1]
        if s1 > s0:
            out["left"] = fmt_seconds((t1 - t0) / (s1 - s0) * max(self.total - step, 0))
        return out
