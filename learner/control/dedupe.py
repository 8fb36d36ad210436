"""The learner's dedupe state: which group ids were answered, in a size that does not grow with
the run.

    seen = SeenSet()
    seen.add("3fa1c2d0:17"); "3fa1c2d0:17" in seen   # True
    seen.discard(group_id)                         # a resume re-opens a ticket
    state = seen.state(); SeenSet.load(state)      # in the checkpoint

Training tickets are numbered per learner life (``RUN_ID:N``, learner/control/scheduler.py) and almost
all of them are answered, nearly in order. So per run id the set keeps a watermark W (every
ticket below it was answered) and the numbers at or above W that were: the watermark moves up
as the gap below the oldest open ticket fills, and what is kept is about the tickets in flight,
not the tickets ever issued. Other ids (evaluation tickets, anything else) are kept in a bounded
first-in first-out window of ``OTHER_KEEP``: a replay older than that is no longer told
``duplicate`` but ``invalid`` (its ticket is closed either way: nothing is trained twice).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import cast


def split_ticket_id(group_id: str) -> tuple[str, int] | None:
    """(run id, ticket number) of a training ticket's id ``RUN:N``; None for any other id
    (evaluation tickets: ``RUN:evalV:ENV:I``)."""
    run, sep, n = group_id.partition(":")
    return (run, int(n)) if sep and n.isdigit() and run else None


class SeenSet:
    OTHER_KEEP = 4096
    """Non-numbered ids remembered (the newest): a few evaluation rounds' worth."""

    def __init__(self) -> None:
        self._runs: dict[str, tuple[int, set[int]]] = {}
        """Run id -> (watermark, numbers >= watermark answered)."""
        self._other: OrderedDict[str, None] = OrderedDict()

    def __contains__(self, group_id: object) -> bool:
        if not isinstance(group_id, str):
            return False
        key = split_ticket_id(group_id)
        if key is None:
            return group_id in self._other
        entry = self._runs.get(key[0])
        return entry is not None and (key[1] < entry[0] or key[1] in entry[1])

    def add(self, group_id: str) -> None:
        key = split_ticket_id(group_id)
        if key is None:
            self._other[group_id] = None
            self._other.move_to_end(group_id)
            while len(self._other) > self.OTHER_KEEP:
                self._other.popitem(last=False)
            return
        run, n = key
        mark, above = self._runs.get(run, (0, set()))
        if n < mark:
            return
        above.add(n)
        while mark in above:  # the gap below the oldest unanswered ticket filled: move up
            above.discard(mark)
            mark += 1
        self._runs[run] = (mark, above)

    def discard(self, group_id: str) -> None:
        """Forget one id (a ticket re-opened by a resume is answered again)."""
        key = split_ticket_id(group_id)
        if key is None:
            self._other.pop(group_id, None)
            return
        run, n = key
        if run not in self._runs:
            return
        mark, above = self._runs[run]
        if n < mark:  # below the watermark: the numbers between it and n stay answered
            above.update(range(n + 1, mark))
            mark = n
        above.discard(n)
        self._runs[run] = (mark, above)

    def start(self, run: str, first: int) -> None:
        """Tickets of ``run`` are numbered from ``first`` (a resumed learner keeps the counter)."""
        mark, above = self._runs.get(run, (first, set()))
        self._runs[run] = (max(mark, first) if not above else mark, above)

    def __len__(self) -> int:
        """Ids remembered one by one (what the checkpoint holds beyond one number per run)."""
        return sum(len(a) for _, a in self._runs.values()) + len(self._other)

    def state(self) -> dict[str, object]:
        return {"runs": {r: [m, sorted(a)] for r, (m, a) in self._runs.items()}, "other": list(self._other)}

    @classmethod
    def load(cls, state: object) -> SeenSet:
        """From ``state()``, or from the plain list of ids older checkpoints hold."""
        s = cls()
        if isinstance(state, dict):
            for run, (mark, above) in state.get("runs", {}).items():
                s._runs[run] = (int(mark), {int(n) for n in above})
            for g in state.get("other", []):
                s._other[g] = None
        else:
            for g in cast("list[str]", state or []):  # older checkpoints' plain list of ids
                s.add(g)
        return s
