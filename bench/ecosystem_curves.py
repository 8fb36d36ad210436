"""The "Environments from other hubs" table and curves of docs/results.md: one ``agentgym train``
run per adapter config of configs/ecosystem/, its training and held-out success and reward.

    nice -n 19 python bench/ecosystem_curves.py --train reasoning_gym   # run one config (30 steps), then rebuild
    python bench/ecosystem_curves.py                                    # rebuild the table and the plot

``--train NAME ...`` runs ``COMMAND`` for each named config, one after another, into
``runs/eco-<NAME>``. Without it, each adapter's run directory (``metrics.jsonl``: a line per
learner step; ``eval.jsonl``: a line per held-out evaluation; ``logs/launcher.jsonl``: launch to
exit) is read when it is there and copied to a compact record, ``docs/results-data/ecosystem/
<NAME>.json`` (per step: success and reward; per evaluation the same), and the record is read
where the run directory is not: a fresh clone rebuilds the same table (between the markers of
``--table``) and plot (``--plot``).
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tomllib
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
ADAPTERS = ("reasoning_gym", "textarena", "skyrl_gym", "verifiers", "openenv")
COMMAND = (
    "agentgym train --config configs/ecosystem/{name}.toml --max-steps {steps} --run-dir runs/eco-{name} "
    "-o 'learner.bind=\"tcp://127.0.0.1:5761\"' -o actor.connect_timeout_s=600"
)
"""What each row ran. The two overrides: a port other than the default 5555 (another run held it),
and a longer wait for the learner (the engines start slowly on a loaded machine). A run on another
engine than the configs' vLLM adds ``-o actor.engine=...`` (``command_of``)."""
BEGIN, END = "<!-- ecosystem-table -->", "<!-- /ecosystem-table -->"
EDGE = 5
"""Training figures are the mean of the first and of the last ``EDGE`` steps (one step's 32-64
episodes are noisy)."""


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _stamp(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00")).timestamp()


ACTOR_DEFAULTS = {"engine": "vllm", "env_workers": 0, "max_groups": 16}
"""The actor options a row may override (the engine, and the env workers where a pool of unforked
workers does not fit in memory), at agentgym's defaults."""


def command_of(name: str, cfg: dict[str, Any]) -> str:
    """The command of a run, from the config it saved: ``COMMAND`` with an ``-o`` for each actor
    option of ``ACTOR_DEFAULTS`` that differs from the config file's own."""
    command = COMMAND.format(name=name, steps=cfg["run"]["max_steps"])
    path = REPO / "configs" / "ecosystem" / f"{name}.toml"
    own = {**ACTOR_DEFAULTS, **(tomllib.loads(path.read_text()).get("actor", {}) if path.exists() else {})}
    for key in ACTOR_DEFAULTS:
        value = cfg.get("actor", {}).get(key, own[key])
        if value != own[key]:
            command += f" -o 'actor.{key}={json.dumps(value)}'"
    return command


def record_of(name: str, run_dir: Path) -> dict[str, Any]:
    """The compact record of one run directory."""
    steps = _jsonl(run_dir / "metrics.jsonl")
    evals = _jsonl(run_dir / "eval.jsonl")
    launcher = _jsonl(run_dir / "logs" / "launcher.jsonl")
    cfg = tomllib.loads((run_dir / "config.toml").read_text())
    kwargs = cfg["env"].get("kwargs", {})
    summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").exists() else {}
    return {
        "adapter": name,
        "config": f"configs/ecosystem/{name}.toml",
        "env": cfg["env"]["name"],
        "env_kwargs": {k: v for k, v in kwargs.items() if k != "python_path"},
        "model": cfg["model"]["path"],
        "command": command_of(name, cfg),
        "engine": cfg.get("actor", {}).get("engine", "vllm"),
        "steps": len(steps),
        "max_steps": cfg["run"]["max_steps"],
        "ended": summary.get("reason", ""),  # "run finished", or the signal that stopped it
        "episodes_per_step": cfg["learner"]["batch_groups"] * cfg["rollout"]["group_size"],
        "eval_episodes": evals[0]["episodes"] if evals else 0,
        "env_failures": sum(int(s.get("episodes_env_failure", 0)) for s in steps[-1:]),
        # launch to the launcher's last line (engines starting included); first to last step
        "wall_s": round(_stamp(launcher[-1]) - _stamp(launcher[0]), 1) if launcher else None,
        "train_s": round(steps[-1]["time"] - steps[0]["time"], 1) if len(steps) > 1 else None,
        "date": launcher[0]["timestamp"][:10] if launcher else "",
        "train": [[s["step"], round(s["success_rate"], 4), round(s["reward_mean"], 4)] for s in steps],
        "eval": [[e["step"], round(e["success_rate"], 4), round(e["reward_mean"], 4)] for e in evals],
    }


def load_records(runs: Path, record_dir: Path, write: bool = True) -> dict[str, dict[str, Any]]:
    out = {}
    for name in ADAPTERS:
        run_dir = runs / f"eco-{name}"
        if _jsonl(run_dir / "metrics.jsonl"):  # a run that took at least one step
            rec = record_of(name, run_dir)
            if write:
                record_dir.mkdir(parents=True, exist_ok=True)
                (record_dir / f"{name}.json").write_text(json.dumps(rec, indent=None) + "\n")
            out[name] = rec
        elif (record_dir / f"{name}.json").exists():
            out[name] = json.loads((record_dir / f"{name}.json").read_text())
    return out


def _mean(rows: list[list[float]], col: int) -> float:
    return sum(r[col] for r in rows) / len(rows)


def table(records: dict[str, dict[str, Any]]) -> str:
    head = (
        "| env (config) | steps | training success, first → last 5 steps | training reward, first → last 5 steps "
        "| held-out success (reward): start → end | env failures | wall, launch to exit (first to last step) |\n"
        "|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for name in ADAPTERS:
        if name not in records:
            lines.append(f"| {name} | not run | - | - | - | - | - |")
            continue
        r = records[name]
        tr, ev = r["train"], r["eval"]
        k = min(EDGE, len(tr))
        first, last = tr[:k], tr[-k:]
        held = (
            f"{ev[0][1]:.2f} ({ev[0][2]:.2f}) at step {ev[0][0]} → {ev[-1][1]:.2f} ({ev[-1][2]:.2f}) at step "
            f"{ev[-1][0]}, {r['eval_episodes']} episodes"
            if len(ev) > 1
            else f"{ev[0][1]:.2f} ({ev[0][2]:.2f}) at step {ev[0][0]} only, {r['eval_episodes']} episodes"
            if ev
            else "-"
        )
        train_s = f" ({r['train_s']:.0f} s)" if r.get("train_s") else ""
        steps = str(r["steps"])
        if r["steps"] < r["max_steps"]:
            steps += f" of {r['max_steps']} ({r['ended'] or 'stopped'})"
        lines.append(
            f"| {name} (`{r['config']}`) | {steps} | {_mean(first, 1):.2f} → {_mean(last, 1):.2f} "
            f"| {_mean(first, 2):.2f} → {_mean(last, 2):.2f} | {held} | {r['env_failures']} "
            f"| {r['wall_s']:.0f} s{train_s} |"
        )
    lines.append("")
    lines.append("Each row's command, from the repository's root (`nice -n 19` in front, on the shared machine):")
    lines.append("")
    for name in ADAPTERS:
        if name in records:
            lines.append(f"    {records[name]['command']}")
    return "\n".join(lines)


def write_table(path: Path, text: str) -> None:
    page = path.read_text()
    if BEGIN not in page or END not in page:
        raise SystemExit(f"ecosystem_curves: {path} has no {BEGIN} ... {END} markers to put the table between")
    head, rest = page.split(BEGIN, 1)
    path.write_text(f"{head}{BEGIN}\n{text}\n{END}{rest.split(END, 1)[1]}")


def plot(records: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in ADAPTERS if n in records]
    if not names:
        return
    fig, axes = plt.subplots(1, len(names), figsize=(3.6 * len(names), 3.2), squeeze=False)
    for ax, name in zip(axes.flat, names):
        r = records[name]
        tr, ev = r["train"], r["eval"]
        steps = [t[0] for t in tr]
        ax.plot(steps, [t[1] for t in tr], color="C0", lw=0.8, alpha=0.5, label="training success")
        run = [_mean(tr[max(0, i - EDGE + 1) : i + 1], 1) for i in range(len(tr))]
        ax.plot(steps, run, color="C0", lw=1.8, label=f"training success, mean of {EDGE}")
        ax.plot(steps, [t[2] for t in tr], color="C1", lw=0.8, ls="--", label="training reward")
        if ev:
            ax.plot([e[0] for e in ev], [e[1] for e in ev], "o-", color="C2", label="held-out success")
        low = min([0.0] + [t[2] for t in tr])
        ax.set_ylim(low - 0.02, 1.02)
        ax.set_title(f"{name}", fontsize=9)
        ax.set_xlabel("learner step", fontsize=8)
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=6)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"wrote {path}")


def train(names: list[str], steps: int, engine: str = "vllm") -> None:
    for name in names:
        if name not in ADAPTERS:
            raise SystemExit(f"ecosystem_curves: unknown adapter {name!r}; the adapters: {', '.join(ADAPTERS)}")
        cmd = shlex.split(command_of(name, {"run": {"max_steps": steps}, "actor": {"engine": engine}}))
        cmd[0] = str(Path(sys.executable).parent / "agentgym")
        print(f"ecosystem_curves: {shlex.join(cmd)}", flush=True)
        subprocess.run(cmd, cwd=REPO, check=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train", nargs="*", default=None, metavar="NAME", help="run these configs first")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--engine", default="vllm", help="the actors' engine (hf: starts in seconds, no batching)")
    ap.add_argument("--runs", type=Path, default=REPO / "runs")
    ap.add_argument("--record", type=Path, default=REPO / "docs" / "results-data" / "ecosystem")
    ap.add_argument("--table", type=Path, default=REPO / "docs" / "results.md")
    ap.add_argument("--plot", type=Path, default=REPO / "docs" / "img" / "results_ecosystem.png")
    args = ap.parse_args(argv)
    if args.train is not None:
        train(args.train or list(ADAPTERS), args.steps, args.engine)
    records = load_records(args.runs, args.record)
    text = table(records)
    print(text)
    write_table(args.table, text)
    plot(records, args.plot)


if __name__ == "__main__":
    main()
