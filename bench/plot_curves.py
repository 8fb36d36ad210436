"""Plot held-out success curves written by bench/learn_curve.py or bench/scaling_inter.py.

    python bench/plot_curves.py runs/curves/base runs/curves/stable --out docs/img/stability.png \
        [--title "..."] [--table]

Each argument is a folder of ``seed<S>.json`` files ({"curve": [[step, success], ...], ...}), or
a folder of run directories of ``agentgym train`` (each with ``eval.jsonl`` and ``config.toml``,
whose ``run.seed`` names the seed); one line per folder: the mean over the seeds that reached each step, a band from the lowest to
the highest seed, thin lines per seed. ``--table`` also prints a Markdown table of the mean (min-max) at each evaluated step.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def load(folder: Path) -> dict[int, list[tuple[int, float]]]:
    runs = {}
    for f in sorted(folder.glob("seed*.json")):
        runs[int(f.stem[4:])] = [tuple(p) for p in json.loads(f.read_text())["curve"]]
    for f in sorted(folder.glob("*/eval.jsonl")):  # run directories of `agentgym train`
        import tomllib

        seed = tomllib.loads((f.parent / "config.toml").read_text())["run"]["seed"]
        evals = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        runs[seed] = [(e["step"], e["success_rate"]) for e in evals]
    if not runs:
        raise SystemExit(f"{folder}: no seed*.json files and no run directories with eval.jsonl")
    return runs


def summary(runs: dict[int, list[tuple[int, float]]]) -> list[tuple[int, float, float, float, int]]:
    """(step, mean, min, max, n) over the seeds that evaluated each step (a run cut short counts
    only where it got to; n says how many did)."""
    steps = sorted(set.union(*(set(s for s, _ in c) for c in runs.values())))
    out = []
    for s in steps:
        vals = [dict(c)[s] for c in runs.values() if s in dict(c)]
        out.append((s, sum(vals) / len(vals), min(vals), max(vals), len(vals)))
    return out


def plot(folders: list[Path], out: Path, title: str = "", labels: list[str] | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for i, folder in enumerate(folders):
        runs = load(folder)
        rows = summary(runs)
        label = (labels[i] if labels else folder.name) + f" ({len(runs)} seeds)"
        line = ax.plot([r[0] for r in rows], [r[1] for r in rows], label=label, lw=2)[0]
        ax.fill_between(
            [r[0] for r in rows], [r[2] for r in rows], [r[3] for r in rows], color=line.get_color(), alpha=0.15
        )
        for c in runs.values():
            ax.plot([p[0] for p in c], [p[1] for p in c], color=line.get_color(), lw=0.6, alpha=0.5)
    ax.set_xlabel("learner step")
    ax.set_ylabel("held-out success")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title, fontsize=10)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


def table(folders: list[Path]) -> str:
    lines = []
    for folder in folders:
        runs = load(folder)
        rows = summary(runs)
        lines.append(f"\n{folder.name} ({len(runs)} seeds: {sorted(runs)})\n")
        lines.append("| step | " + " | ".join(str(r[0]) for r in rows) + " |")
        lines.append("|---" * (len(rows) + 1) + "|")
        lines.append(
            "| mean (min-max) | " + " | ".join(f"{r[1]:.2f} ({r[2]:.2f}-{r[3]:.2f}, n={r[4]})" for r in rows) + " |"
        )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folders", type=Path, nargs="+")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--title", default="")
    p.add_argument("--labels", default="", help="comma-separated legend labels, one per folder")
    p.add_argument("--table", action="store_true")
    args = p.parse_args()
    plot(args.folders, args.out, args.title, args.labels.split(",") if args.labels else None)
    if args.table:
        print(table(args.folders))
    return 0


if __name__ == "__main__":
    sys.exit(main())
