"""Launch to first optimizer step, phase by phase, from a run directory's JSON logs.

    agentgym train --config configs/quickstart.toml -o eval.at_start=false --max-steps 3 --run-dir runs/su
    python bench/startup_phases.py runs/su            # one line per phase, seconds from the launch

Reads RUN_DIR/logs/launcher.jsonl, learner.jsonl and actor-*.jsonl (their timestamps and the
timing fields of ``engine_started``) and prints when each phase ended, counted from the
launcher's ``launched`` event (the model, when ``agentgym train`` had to make it, is before
that and not counted). Per actor: imports done (its first event), engine import and build
(``engine_started``'s ``import_s`` and ``build_s``), engine ready, first rollout sent.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from pathlib import Path


def _events(path: Path) -> list[dict]:
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def _t(event: dict) -> float:
    return datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00")).timestamp()


def _first(events: list[dict], name: str) -> dict | None:
    return next((e for e in events if e.get("event") == name), None)


def phases(run_dir: Path) -> list[tuple[str, float | None, str]]:
    """(phase, seconds from the launch when it ended, detail) for the run's start-up."""
    logs = run_dir / "logs"
    launcher = _events(logs / "launcher.jsonl")
    launched = [e for e in launcher if e.get("event") == "launched"]
    if not launched:
        raise SystemExit(f"{logs / 'launcher.jsonl'}: no `launched` event (a run of `agentgym train`?)")
    t0 = _t(launched[-1])
    learner = [e for e in _events(logs / "learner.jsonl") if _t(e) >= t0]
    rows: list[tuple[str, float | None, str]] = []

    def at(name: str, events: list[dict], label: str, detail: str = "") -> None:
        e = _first(events, name)
        rows.append((label, None if e is None else _t(e) - t0, detail))

    at("learner_starting", learner, "learner: imports done")
    at("learner_listening", learner, "learner: model loaded, listening")
    for path in sorted(logs.glob("actor-*.jsonl")):
        actor = [e for e in _events(path) if _t(e) >= t0]
        name = path.stem
        if actor:
            rows.append((f"{name}: imports done", _t(actor[0]) - t0, actor[0].get("event", "")))
        at("actor_registered", actor, f"{name}: registered")
        vllm = next((e for e in actor if e.get("event") == "engine_started" and "build_s" in e), None)
        started = [e for e in actor if e.get("event") == "engine_started" and "engine" not in e]
        ready = started[0] if started else None
        detail = ""
        if ready is not None and "tokenizer_s" in ready:
            detail = f"tokenizer {ready['tokenizer_s']} s"
        if vllm is not None:
            detail += f", vllm import {vllm['import_s']} s, engine build {vllm['build_s']} s"
        rows.append((f"{name}: engine ready", None if ready is None else _t(ready) - t0, detail))
        at("first_rollout_sent", actor, f"{name}: first rollout sent")
    step = next((e for e in learner if e.get("event") == "step"), None)
    rows.append(("learner: first optimizer step", None if step is None else _t(step) - t0, ""))
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", type=Path)
    args = p.parse_args(argv)
    for label, seconds, detail in phases(args.run_dir):
        when = "-" if seconds is None else f"{seconds:6.1f}"
        print(f"{when:>7} s  {label}" + (f"  ({detail})" if detail else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
