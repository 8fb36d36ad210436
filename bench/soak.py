"""Soak: a learner and local actors train for N minutes; the memory (RSS) of every process is
sampled over time, to see whether anything grows without bound.

    flock /work/wt/bench.lock python bench/soak.py --minutes 10 --out /tmp/soak [-o KEY=VALUE ...]

Runs ``agentgym train --config configs/quickstart.toml`` (2 actors, a run long enough not to
end) and every ``--every`` seconds records the RSS of the learner and of each actor, each
summed with its child processes (an actor's vLLM engine core, environment workers), to
OUT/rss.jsonl. At the end it stops the run with SIGINT and prints, per process, the RSS after
the first minute, at the end, and the growth per 10 minutes from a least-squares line over the
samples after the first minute (start-up allocations excluded). Writes OUT/soak.json too.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]


def tree_rss(p: psutil.Process) -> int:
    total = 0
    for q in [p, *p.children(recursive=True)]:
        try:
            total += q.memory_info().rss
        except psutil.Error:
            continue
    return total


def roles(launcher: psutil.Process) -> dict[str, psutil.Process]:
    """The launcher's direct children by role: the learner, and the actors by local id."""
    out = {}
    for c in launcher.children():
        try:
            cmd = c.cmdline()
        except psutil.Error:
            continue
        if "agentgym.learner.main" in cmd:
            out["learner"] = c
        elif "agentgym.actors.main" in cmd:
            out[cmd[cmd.index("--actor-id") + 1] if "--actor-id" in cmd else f"actor-{c.pid}"] = c
    return out


def slope_per_10min(points: list[tuple[float, float]]) -> float:
    n = len(points)
    if n < 2:
        return 0.0
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    return 0.0 if var == 0 else 600 * sum((t - mt) * (v - mv) for t, v in points) / var


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--every", type=float, default=10.0, help="seconds between samples")
    ap.add_argument("--out", type=Path, default=Path("/tmp/agentgym-soak"))
    ap.add_argument("--actors", type=int, default=2)
    ap.add_argument("-o", "--override", action="append", default=[])
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    run_dir = args.out / "run"
    cmd = [sys.executable, "-m", "agentgym.cli", "train", "--config", str(REPO / "configs" / "quickstart.toml"),
           "--run-dir", str(run_dir), "--actors", str(args.actors), "--max-steps", "1000000",
           "-o", f'model.path="{args.out / "tiny"}"', *[a for o in args.override for a in ("-o", o)]]  # fmt: skip
    with (args.out / "console.log").open("ab") as console:
        launcher = subprocess.Popen(cmd, cwd=args.out, stdout=console, stderr=subprocess.STDOUT)
    lp = psutil.Process(launcher.pid)
    t0 = time.monotonic()
    series: dict[str, list[tuple[float, float]]] = {}
    with (args.out / "rss.jsonl").open("w") as f:
        while time.monotonic() - t0 < 60 * args.minutes and launcher.poll() is None:
            t = time.monotonic() - t0
            rec = {name: tree_rss(p) / 2**20 for name, p in roles(lp).items()}
            for name, mib in rec.items():
                series.setdefault(name, []).append((t, mib))
            f.write(json.dumps({"t": round(t, 1), **{k: round(v, 1) for k, v in rec.items()}}) + "\n")
            f.flush()
            print(f"t={t:6.0f}s " + " ".join(f"{k}={v:.0f}MiB" for k, v in rec.items()), flush=True)
            time.sleep(args.every)
    if launcher.poll() is None:
        launcher.send_signal(signal.SIGINT)
        launcher.wait(timeout=180)
    steps = 0
    metrics = run_dir / "metrics.jsonl"
    if metrics.exists():
        lines = metrics.read_text().splitlines()
        steps = json.loads(lines[-1])["step"] if lines else 0
    result = {"minutes": args.minutes, "steps": steps, "processes": {}}
    print(f"\n{'process':<12} {'after 1 min':>12} {'at end':>10} {'growth / 10 min (fit)':>22}")
    for name, pts in series.items():
        late = [p for p in pts if p[0] >= 60] or pts
        row = {"rss_mib_after_1min": round(late[0][1], 1), "rss_mib_end": round(pts[-1][1], 1),
               "growth_mib_per_10min": round(slope_per_10min(late), 1), "samples": len(pts)}  # fmt: skip
        result["processes"][name] = row  # type: ignore[index]
        print(f"{name:<12} {row['rss_mib_after_1min']:>10} MiB {row['rss_mib_end']:>6} MiB {row['growth_mib_per_10min']:>18} MiB")
    print(f"learner steps: {steps}")
    (args.out / "soak.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
