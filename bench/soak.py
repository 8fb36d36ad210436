"""Soak: a learner and local actors train for N minutes; the memory of every process is sampled
over time, to see whether anything grows without bound.

    python bench/soak.py --minutes 10 --out /tmp/soak [-o KEY=VALUE ...]

Runs ``agentgym train --config configs/quickstart.toml`` (2 actors, a run long enough not to
end) and every ``--every`` seconds records the memory (PSS and RSS) and process count of the
learner and of each actor, each summed over its child processes (an actor's vLLM engine core,
environment workers), to OUT/rss.jsonl. At the end it stops the run with SIGINT and prints, per
process, the PSS after the first minute and at the end, and the growth per 10 minutes from a
least-squares line over the samples after the first minute (start-up allocations excluded) and
over the second half. Writes OUT/soak.json too.
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


def tree_mem(p: psutil.Process) -> tuple[float, float, int]:
    """(RSS MiB, PSS MiB, processes) of ``p`` and all its descendants. RSS counts a page shared
    by forked env workers once per worker; PSS splits it between them, so PSS adds up."""
    rss = pss = 0
    n = 0
    for q in [p, *p.children(recursive=True)]:
        try:
            full = q.memory_full_info()
        except psutil.Error:
            continue
        rss, pss, n = rss + full.rss, pss + full.pss, n + 1
    return rss / 2**20, pss / 2**20, n


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
    cmd = [
        sys.executable,
        "-m",
        "agentgym.cli",
        "train",
        "--config",
        str(REPO / "configs" / "quickstart.toml"),
        "--run-dir",
        str(run_dir),
        "--actors",
        str(args.actors),
        "--max-steps",
        "1000000",
        "-o",
        f'model.path="{args.out / "tiny"}"',
        *[a for o in args.override for a in ("-o", o)],
    ]
    with (args.out / "console.log").open("ab") as console:
        launcher = subprocess.Popen(cmd, cwd=args.out, stdout=console, stderr=subprocess.STDOUT)
    lp = psutil.Process(launcher.pid)
    t0 = time.monotonic()
    series: dict[str, list[tuple[float, float]]] = {}  # PSS over time, per role
    procs: dict[str, list[int]] = {}
    with (args.out / "rss.jsonl").open("w") as f:
        while time.monotonic() - t0 < 60 * args.minutes and launcher.poll() is None:
            t = time.monotonic() - t0
            mem = {name: tree_mem(p) for name, p in roles(lp).items()}
            for name, (_, pss, n) in mem.items():
                series.setdefault(name, []).append((t, pss))
                procs.setdefault(name, []).append(n)
            f.write(
                json.dumps(
                    {
                        "t": round(t, 1),
                        **{
                            k: {"rss_mib": round(r, 1), "pss_mib": round(p, 1), "processes": n}
                            for k, (r, p, n) in mem.items()
                        },
                    }
                )
                + "\n"
            )
            f.flush()
            print(f"t={t:6.0f}s " + " ".join(f"{k}={p:.0f}MiB/{n}p" for k, (_, p, n) in mem.items()), flush=True)
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
    # Two fits: after the first minute (start-up excluded), and over the second half of the run,
    # once actors have sized their concurrency (their env workers, one per concurrent episode,
    # are started as they grow): growth there is what would go on for hours.
    print(
        f"\n{'process':<12} {'PSS 1 min':>10} {'PSS end':>10} {'procs':>6} {'growth/10min after 1 min':>25} {'2nd half':>9}"
    )
    half = 30 * args.minutes
    for name, pts in series.items():
        late = [p for p in pts if p[0] >= 60] or pts
        second = [p for p in pts if p[0] >= half] or pts
        row = {
            "pss_mib_after_1min": round(late[0][1], 1),
            "pss_mib_end": round(pts[-1][1], 1),
            "processes_end": procs[name][-1],
            "growth_mib_per_10min": round(slope_per_10min(late), 1),
            "growth_mib_per_10min_second_half": round(slope_per_10min(second), 1),
            "samples": len(pts),
        }
        result["processes"][name] = row
        print(
            f"{name:<12} {row['pss_mib_after_1min']:>6} MiB {row['pss_mib_end']:>6} MiB {row['processes_end']:>6} "
            f"{row['growth_mib_per_10min']:>21} MiB {row['growth_mib_per_10min_second_half']:>5} MiB"
        )
    print(f"learner steps: {steps}")
    (args.out / "soak.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
