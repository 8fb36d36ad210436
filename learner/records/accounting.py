"""Where every training ticket went: a journal on disk and the identity ``summary.json`` checks.

    acc = TicketLedger(run_dir / "tickets.jsonl")
    acc.issued(tickets)                    # from Learner.grant (re-grants of known ids are ignored)
    acc.judged(group_id, status)           # every rollout's ack status (duplicates/eval ignored)
    acc.trained(group_ids, step)           # the groups of one optimizer step
    acc.expired(group_id)                  # dropped from the buffer past max_staleness
    reopened = acc.resume(checkpoint_step) # after a learner restart: tickets to issue again
    acc.summary(open_ids)                  # the table: issued = trained + ... + open

A ticket's fate is one of ``trained``, ``expired``, ``stale``, ``invalid``, ``failed`` (every
episode hit an environment failure), ``filtered`` (every episode got the same reward, with
``learner.filter_groups``), or ``accepted`` (acknowledged, waiting in the buffer). A
ticket with no fate yet is in flight: held by an actor or queued for re-issue. The tickets of
an actor that dies or goes silent keep no fate: the scheduler re-issues the same ids, so a
partly played group costs only the work, never the ticket (``reissued`` counts them).

The journal is append-only JSON lines written as things happen (a SIGKILLed learner loses
nothing the kernel was given). A resumed learner replays it against the checkpoint it loaded:
groups trained at steps after that checkpoint were trained into weights that no longer exist,
and accepted-but-untrained groups died with the old buffer; both, with the tickets that were in
flight, are re-opened and issued again under their old ids (``lost_in_restart`` counts them by
reason). So an accepted ack is never lost: its ticket ends trained, expired or open at the end,
each named. ADR 0010 says why.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import TextIO

import msgspec

from agentgym.protocol import Handover, Rollout, Ticket

FATES = ("trained", "expired", "stale", "invalid", "failed", "filtered")
"""Final fates; ``accepted`` is a waiting state, not a final one."""


def is_training(t: Ticket) -> bool:
    return t.split == "train"


class TicketLedger:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.tickets: dict[str, Ticket] = {}
        """Every training ticket ever issued in this run (all learner lives), by group id."""
        self.fate: dict[str, str] = {}
        self.trained_at: dict[str, int] = {}
        self.reissued = 0
        self.handovers: Counter[str] = Counter()
        """Hand-overs from actors that left (actors/play/handover.py): groups, their partial and
        finished episodes, the tokens carried; and episodes trained-to-be (accepted) that a
        second actor continued. Events beside the identity: a handed-over group is one ticket."""
        self.lost_in_restart: Counter[str] = Counter()
        self.unissued: Counter[str] = Counter()
        """Rollouts for training ids this run never issued (e.g. from a learner life whose
        journal lines were lost), by ack status: outside the identity, shown beside it."""
        self._out: TextIO | None = None
        self.settled: Counter[str] = Counter()
        """Tickets folded into counts by ``compact``, by final fate (no longer kept one by one)."""

    # ------------------------------------------------------------------ journal
    def _write(self, rec: dict[str, object]) -> None:
        if self._out is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            torn = False
            if self.path.exists() and self.path.stat().st_size > 0:
                with self.path.open("rb") as f:
                    f.seek(-1, 2)
                    torn = f.read(1) != b"\n"
            self._out = self.path.open("a", buffering=1)  # a line at a time
            if torn:  # a killed learner's last line was cut short: never glue a new one to it
                self._out.write("\n")
        self._out.write(json.dumps(rec, separators=(",", ":")) + "\n")

    def close(self) -> None:
        if self._out is not None:
            self._out.close()
            self._out = None

    def compact(self, keep_from_step: int) -> int:
        """Fold the tickets settled for good into counts and rewrite the journal without them, so
        neither it nor this ledger grows with the run. Settled for good: a final fate other than
        trained, or trained at a step <= ``keep_from_step`` (the oldest checkpoint kept: a resume
        from any kept checkpoint re-opens only what was trained after it, and those stay). The
        new journal is written beside the old one and renamed over it (a kill leaves one whole).
        Returns the tickets folded."""
        done = [
            g for g, f in self.fate.items() if f in FATES and (f != "trained" or self.trained_at[g] <= keep_from_step)
        ]
        if not done:
            return 0
        for g in done:
            self.settled[self.fate.pop(g)] += 1
            del self.tickets[g]
            self.trained_at.pop(g, None)
        recs: list[dict[str, object]] = [
            {"e": "base", "settled": dict(self.settled), "lost": dict(self.lost_in_restart)}
        ]
        for g, t in self.tickets.items():
            recs.append({"e": "issue", "t": msgspec.to_builtins(t)})
            f = self.fate.get(g)
            if f is not None:
                recs.append({"e": f, "g": g, **({"s": self.trained_at[g]} if f == "trained" else {})})
        tmp = self.path.with_name(self.path.name + ".tmp")
        with tmp.open("w") as out:
            out.writelines(json.dumps(r, separators=(",", ":")) + "\n" for r in recs)
        self.close()
        os.replace(tmp, self.path)
        return len(done)

    # ------------------------------------------------------------------ events
    def issued(self, tickets: Iterable[Ticket]) -> None:
        for t in tickets:
            if not is_training(t):
                continue
            if t.group_id in self.tickets:
                self.reissued += 1  # the same id again: its first holder left or was lost
                continue
            self.tickets[t.group_id] = t
            self._write({"e": "issue", "t": msgspec.to_builtins(t)})

    def judged(self, group_id: str, status: str) -> None:
        if status in ("duplicate", "eval"):
            return
        if group_id not in self.tickets:
            self.unissued[status] += 1
            return
        self.fate[group_id] = status
        self._write({"e": status, "g": group_id})

    def handed_over(self, h: Handover) -> None:
        self.handovers["groups"] += 1
        self.handovers["partial_episodes"] += len(h.partial)
        self.handovers["finished_episodes"] += len(h.finished)
        self.handovers["tokens_carried"] += sum(len(p.token_ids) // 4 for p in h.partial)

    def resumed(self, r: Rollout) -> None:
        """An accepted rollout: count its episodes that were continued from a hand-over."""
        self.handovers["episodes_resumed_accepted"] += sum(1 for e in r.episodes if e.resumed_at > 0)

    def trained(self, group_ids: Iterable[str], step: int) -> None:
        for g in group_ids:
            if g in self.tickets:
                self.fate[g] = "trained"
                self.trained_at[g] = step
                self._write({"e": "trained", "g": g, "s": step})

    def expired(self, group_id: str) -> None:
        if group_id in self.tickets:
            self.fate[group_id] = "expired"
            self._write({"e": "expired", "g": group_id})

    # ------------------------------------------------------------------ resume
    def resume(self, checkpoint_step: int) -> list[Ticket]:
        """Replay the journal of earlier learner lives against the checkpoint loaded; return the
        tickets to issue again (oldest first) and journal that they were re-opened."""
        if self.path.exists():
            for line in self.path.read_text().splitlines():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue  # the last line of a killed learner may be cut short
                e = rec.get("e")
                if e == "base":  # a compacted journal's first line: what was folded into counts
                    self.settled.update(rec.get("settled", {}))
                    self.lost_in_restart.update(rec.get("lost", {}))
                elif e == "issue":
                    t = msgspec.convert(rec["t"], Ticket)
                    self.tickets.setdefault(t.group_id, t)
                elif e == "reopen":  # by an earlier resume: counted in this run's totals too
                    self.fate.pop(rec["g"], None)
                    self.trained_at.pop(rec["g"], None)
                    self.lost_in_restart[rec.get("why", "in_flight")] += 1
                elif e in (*FATES, "accepted") and rec.get("g") in self.tickets:
                    self.fate[rec["g"]] = e
                    if e == "trained":
                        self.trained_at[rec["g"]] = int(rec["s"])
        reopened: list[Ticket] = []
        for g, t in self.tickets.items():
            fate = self.fate.get(g)
            if fate == "trained" and self.trained_at[g] <= checkpoint_step:
                continue
            if fate in ("expired", "stale", "invalid", "failed", "filtered"):
                continue
            reason = {"trained": "trained_after_checkpoint", "accepted": "buffered"}.get(fate or "", "in_flight")
            self.lost_in_restart[reason] += 1
            self.fate.pop(g, None)
            self.trained_at.pop(g, None)
            self._write({"e": "reopen", "g": g, "why": reason})
            reopened.append(t)
        return reopened

    # ------------------------------------------------------------------ summary
    def summary(self, buffered: Iterable[str], in_flight: Iterable[str]) -> dict[str, object]:
        """The accounting table at the end of a learner life. ``buffered``: group ids accepted
        and still in the buffer; ``in_flight``: ids held by actors or queued for re-issue."""
        by_fate = Counter(self.fate.values()) + self.settled
        issued = len(self.tickets) + sum(self.settled.values())
        buffered_ids = {g for g in buffered if g in self.tickets}
        open_ids = {g for g in in_flight if g in self.tickets and g not in self.fate}
        out: dict[str, object] = {"issued": issued, **{f: by_fate.get(f, 0) for f in FATES}}
        out["untrained_at_end"] = by_fate.get("accepted", 0)
        out["in_flight_at_end"] = len(open_ids)
        settled = sum(int(out[k]) for k in (*FATES, "untrained_at_end", "in_flight_at_end"))  # type: ignore[call-overload]  # these entries are counts
        out["unaccounted"] = issued - settled
        """Tickets with no fate that no actor holds and no queue has: must be 0."""
        out["accepted_not_buffered"] = by_fate.get("accepted", 0) - len(buffered_ids)
        """Acknowledged accepted, never trained nor expired, and gone from the buffer: must be 0."""
        out["reissued"] = self.reissued
        out["handovers"] = dict(self.handovers)
        out["lost_in_restart"] = dict(self.lost_in_restart)
        out["unissued_arrivals"] = dict(self.unissued)
        return out


def format_table(acc: dict[str, object]) -> str:
    """The accounting of a summary.json as a small text table (``agentgym chaos`` prints it)."""
    rows = [("issued", acc["issued"])]
    rows += [(k, acc[k]) for k in (*FATES, "untrained_at_end", "in_flight_at_end", "unaccounted")]
    rows += [("reissued (event)", acc["reissued"])]
    rows += [(f"handed over: {k} (event)", v) for k, v in sorted(dict(acc.get("handovers", {})).items())]  # type: ignore[call-overload]  # a name -> count mapping
    rows += [(f"lost_in_restart: {k} (re-issued)", v) for k, v in sorted(dict(acc["lost_in_restart"]).items())]  # type: ignore[call-overload]  # a name -> count mapping
    rows += [(f"unissued arrivals: {k}", v) for k, v in sorted(dict(acc["unissued_arrivals"]).items())]  # type: ignore[call-overload]  # a name -> count mapping
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
