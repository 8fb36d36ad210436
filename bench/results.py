"""The results table: every built-in env, four arms, held-out success (docs/results.md).

    nice python bench/results.py --rows maze3 --seeds 0,1,2          # run one row (~20 min per run at most)
    nice python bench/results.py --rows all                          # every row, one after another
    python bench/results.py --table-only                             # rebuild docs/results.md from runs/results
    python bench/results.py --mix-curves runs/mix-games --plot x.png # per-env curves of a run on configs/envs/mix.toml
    nice python bench/results.py --suite real --rows real/guess_number --seeds 0,1,2 --steps 40 --engine vllm
    python bench/results.py --suite real --table-only --table docs/results.md --plot docs/img/results_real.png

``--suite real`` is the real model's table (``REAL_ROWS``: configs/real/<env>.toml, SmolLM2-135M-Instruct
with the env's outcome reward only): its "base" arm is the instruct model zero-shot, and a row meets
its bar at base + 0.15 (``SUITES``); it has its own place on the page and its own record
(docs/results-data/real/).

Each row is a config of ``configs/envs/`` (``ROWS``) and gets these arms, all scored on the same
held-out test tasks (the first ``eval.tasks`` of the row config, or ``--eval-tasks``, of the env's test
split, ``EVAL_EPISODES`` samples each) at the config's final turn limit:

    random     ``Env.random_action`` every turn (uniform over the action space, or its stand-in)
    base       the config's base model before RL (agentgym.models.base: pretrained on random play;
               the labelled ``SFT_ROWS``: trained on the expert's play)
    base + RL  the base model after at most ``--steps`` RL steps or ``--max-wall-s`` seconds of
               training, one run per seed (mean and spread over the seeds)
    expert     ``Env.expert_action``: the scripted ceiling (privileged state)

The RL runs are bench/learn_curve.py's in-process loop: the transformers engine (``--engine vllm``:
the actors' vLLM engine, batched) plays groups with the actor's rollout code on a real EnvPool and
the learner's Trainer takes a step on each batch, synchronously (staleness 0), or with
``--overlap`` while the next batch is played (staleness 1). Results of each row go to
``OUT/<row>/`` (``arms.json``, ``seed<S>.json``), so rows can be run separately, on different
days, and the table is rebuilt from whatever is there; a row not run is listed as such.
``--plot`` draws the held-out curves. ``--table-only`` also copies the rows it finds in ``OUT``
to ``--record`` (docs/results-data: the committed record, without the held-out transcripts and
with a few metrics a step), and reads that record for the rows ``OUT`` does not hold, so a fresh
clone rebuilds the same table; a row in neither keeps the line the page already has, its name
cell marked ``NO_RECORD``.
A row meets the bar when base + RL is >= base + 0.3, or >= 0.8 of the expert; within twice the
standard error of the difference (``noise``) of either it is "borderline". Each row also says how
many of its held-out tasks each seed drew in training (bench/task_overlap.py, replayed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learn_curve import EVAL_EPISODES, LOOP_OVERRIDES, REPO, train_curve, zero_shot  # noqa: E402
from task_overlap import row_overlap  # noqa: E402

from agentgym.config import Config, load_config  # noqa: E402

ROWS = (
    "maze3",
    "maze3-map",
    "maze5",
    "maze5-sft",
    "textcraft1",
    "textcraft1-sft",
    "textcraft1-d0",
    "textcraft2",
    "wordle",
    "wordle-letters",
    "wordle-games",
    "babyai",
    "deepsearch",
    "sciworld",
    "webshop",
)
"""Rows of the table, in order: configs/envs/<row>.toml."""

SFT_ROWS = {"maze5-sft": "maze5", "textcraft1-sft": "textcraft1"}
"""Labelled rows whose model is trained on the expert's play (``model.pretrain_policy = "expert"``),
and the row they stand beside: their "base" arm is SFT on expert and their "base + RL" arm SFT + RL.
The bar is for RL from a base model, so they are never judged by it."""

REAL_ROWS = (
    "real/guess_number",
    "real/maze3",
    "real/maze5",
    "real/babyai",
    "real/textcraft",
    "real/wordle",
    "real/deepsearch",
    "real/webshop",
    "real/sciworld",
)
"""The real model's rows: configs/real/<env>.toml (a row named ``real/<env>``)."""


@dataclass(frozen=True)
class Suite:
    """A table: its rows, where it sits on the page, and its bar."""

    rows: tuple[str, ...]
    markers: tuple[str, str]
    gain: float
    """base + RL meets the bar at base + ``gain`` (mean of 3 seeds) ..."""
    expert_share: float | None
    """... or at this share of the expert's success (None: the gain alone)."""
    command: str


ROW_NOTES = {
    "wordle-games": "every test game is a training game (a game is its word; the 32 test games cover all 16 "
    "words) and the base was trained on the answer in its own turn (ADR 0021)",
}
"""What a row's name cell says beside the row (docs/results.md), where its figures need it."""

NO_RECORD = "no committed record (line kept from the page)"
"""What the name cell of a row kept from the page says: its figures cannot be rebuilt."""

COMMAND = (
    "nice python bench/results.py --rows {rows} --seeds 0,1,2 --steps 100 --max-wall-s 1200 "
    "--table docs/results.md --plot docs/img/results_curves.png"
)


def config_path(row: str) -> Path:
    """configs/envs/<row>.toml, or configs/real/<env>.toml for a row ``real/<env>``."""
    return REPO / "configs" / f"{row if '/' in row else 'envs/' + row}.toml"


def config(row: str, seed: int, overrides: list[str]) -> Config:
    path = config_path(row)
    if not path.exists():
        raise SystemExit(f"results: --rows: no config {path}; rows are {', '.join(ROWS + REAL_ROWS)}")
    return load_config(path, [f"run.seed={seed}", *LOOP_OVERRIDES, *overrides])


def scripted(cfg: Config, policy: str, tasks: int, episodes: int, seed: int = 0) -> dict:
    """Held-out success of ``policy`` ("random" or "expert") played on the env in this process."""
    from agentgym.envpool.registry import resolve_env

    spec = cfg.env.specs[0]
    cls = resolve_env(spec.name)
    env = cls(**spec.kwargs)
    limit = cfg.schedule.for_env(spec.name).final_limit
    ids = list(cls.tasks("test", **spec.kwargs))[:tasks]
    rng = random.Random(seed)
    wins, turns, t0 = [], [], time.time()
    try:
        for task in ids:
            for _ in range(episodes if policy == "random" else 1):  # the expert is deterministic
                env.reset(task)
                won, n = False, 0
                for n in range(1, limit + 1):  # noqa: B007  # n, the turns taken, is read after the loop
                    res = env.step(env.random_action(rng) if policy == "random" else env.expert_action())
                    if res.done:
                        won = bool(res.info.get("success", res.reward > 0))
                        break
                wins.append(won)
                turns.append(n)
    finally:
        env.close()
    return {
        "success": sum(wins) / len(wins),
        "episodes": len(wins),
        "mean_turns": sum(turns) / len(turns),
        "turn_limit": limit,
        "wall_s": round(time.time() - t0, 1),
    }


def run_row(row: str, seeds: list[int], args: argparse.Namespace) -> None:
    from agentgym.models.base import ensure_model

    out = args.out / row
    out.mkdir(parents=True, exist_ok=True)
    cfg = config(row, seeds[0], args.override)
    t0 = time.time()
    if not args.arms_only:
        ensure_model(cfg)  # the base model: made and pretrained once, shared by the seeds
    base_s = time.time() - t0
    pre = Path(cfg.model.path, "pretrain.json")
    n_eval = args.eval_tasks or cfg.eval.tasks  # the row's own eval.tasks unless --eval-tasks
    arms = {
        "row": row,
        "config": str(config_path(row).relative_to(REPO)),
        "model": str(cfg.model.path),
        "eval_tasks": n_eval,
        "pretrain": json.loads(pre.read_text()) if pre.exists() else None,
        "base_make_s": round(base_s, 1),
    }
    for policy in ("random", "expert"):
        arms[policy] = scripted(cfg, policy, n_eval, EVAL_EPISODES)
        print(f"[{row}] {policy}: held-out success {arms[policy]['success']:.3f}", flush=True)
    if args.zero_shot:  # the model as it is, no RL: what a row's step-0 evaluation measures
        limit = cfg.schedule.for_env(cfg.env.specs[0].name).final_limit
        arms["zero_shot"] = asyncio.run(zero_shot(cfg, n_eval, limit, args.engine))
        print(f"[{row}] zero-shot: held-out success {arms['zero_shot']['success']:.3f}", flush=True)
    elif (out / "arms.json").exists():  # keep a zero-shot arm measured earlier
        earlier = json.loads((out / "arms.json").read_text()).get("zero_shot")
        if earlier is not None:
            arms["zero_shot"] = earlier
    (out / "arms.json").write_text(json.dumps(arms, indent=1))
    for seed in [] if args.arms_only or args.zero_shot else seeds:
        cfg = config(
            row,
            seed,
            [*args.override, f"run.max_steps={args.steps}", "model.create_tiny=false", f'actor.engine="{args.engine}"'],
        )
        print(f"[{row} seed {seed}] up to {args.steps} steps / {args.max_wall_s:.0f} s", flush=True)
        res = asyncio.run(
            train_curve(
                cfg,
                args.eval_every,
                n_eval,
                cfg.schedule.final_limit,
                partial=out / f"seed{seed}.json",
                max_wall_s=args.max_wall_s,
                engine_kind=args.engine,
                overlap=args.overlap,
            )
        )
        res.update(
            seed=seed,
            overrides=args.override,
            config=str(config_path(row).relative_to(REPO)),
            engine=args.engine,
            eval_tasks=n_eval,
            overlap=args.overlap,
        )
        (out / f"seed{seed}.json").write_text(json.dumps(res))


RECORD = REPO / "docs" / "results-data"
"""The committed record of the table's runs (``--record``)."""
RECORD_METRICS = ("success_rate", "reward_mean", "entropy", "kl_ref", "loss")
"""The per-step metrics a record keeps (the rest stay in ``OUT``)."""


def where(out: Path, record: Path, row: str) -> Path:
    """The folder holding ``row``'s runs: ``OUT/<row>`` if it has them, else the record's."""
    return out / row if (out / row / "arms.json").exists() else record / row


def save_record(out: Path, record: Path, row: str) -> None:
    """Copy ``OUT/<row>`` to ``RECORD/<row>``: arms as they are (a zero-shot arm without its
    plays); each seed without its held-out plays and with only ``RECORD_METRICS`` of every step."""
    src, dst = out / row, record / row
    if not (src / "arms.json").exists():
        return
    dst.mkdir(parents=True, exist_ok=True)
    for old in dst.glob("seed*.json"):
        old.unlink()
    arms = json.loads((src / "arms.json").read_text())
    if isinstance(arms.get("zero_shot"), dict):
        arms["zero_shot"].pop("plays", None)
    (dst / "arms.json").write_text(json.dumps(arms, indent=1))
    for f in sorted(src.glob("seed*.json")):
        run = json.loads(f.read_text())
        run.pop("plays", None)
        run["steps"] = run.get("steps", len(run["metrics"]))
        run["metrics"] = [
            {k: round(m[k], 5) for k in RECORD_METRICS if isinstance(m.get(k), (int, float))} for m in run["metrics"]
        ]
        (dst / f.name).write_text(json.dumps(run, separators=(",", ":")) + "\n")


def summarise(folder: Path) -> dict | None:
    """The row's figures from what ``run_row`` wrote (None: the row was not run)."""
    arms_file = folder / "arms.json"
    if not arms_file.exists():
        return None
    arms = json.loads(arms_file.read_text())
    runs = [json.loads(f.read_text()) for f in sorted(folder.glob("seed*.json"))]
    done = [r for r in runs if not r.get("partial")]
    base = [r["curve"][0][1] for r in runs if r["curve"]]
    if not base and arms.get("zero_shot"):  # no RL run yet: the zero-shot arm is the base
        base = [arms["zero_shot"]["success"]]
    final = [r["curve"][-1][1] for r in done]
    tasks = arms.get("eval_tasks") or next((r["eval_tasks"] for r in runs if r.get("eval_tasks")), None)
    return {
        **arms,
        "eval_tasks": tasks,
        "base": base,
        "final": final,
        "seeds": [r["seed"] for r in done],
        "steps": [r.get("steps", len(r["metrics"])) for r in done],
        "wall_s": [r["wall_s"] for r in done],
        "entropy": [r["metrics"][-1].get("entropy") for r in done if r["metrics"]],
        "partial": len(runs) - len(done),
        "base_alone": not runs and bool(base),  # the zero-shot arm, measured without an RL run
    }


def _ms(xs: list[float]) -> str:
    if not xs:
        return "-"
    if len(xs) == 1:
        return f"{xs[0]:.2f} (1 seed)"
    return f"{statistics.mean(xs):.2f} ± {statistics.stdev(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})"


def noise(p: float, n: int, q: float, m: int, scale: float = 1.0) -> float:
    """Twice the standard error of ``p - scale * q``, ``p`` and ``q`` the means of ``n`` and ``m``
    independent successes (Bernoulli): the margin within which a difference of two evaluations is
    noise (about 95%). Episodes of one task are not independent, so the real noise is larger."""
    return 2 * math.sqrt(p * (1 - p) / n + scale**2 * q * (1 - q) / m)


def verdict(s: dict, row: str = "", suite: Suite | None = None) -> str:
    """Whether the row meets the bar: base + RL (mean of 3 seeds) >= base + 0.3, or >= 0.8 of the
    expert; "borderline" where the nearer of the two is within ``noise`` of it, either way, with
    n = eval tasks x EVAL_EPISODES x seeds episodes an arm (the expert: eval tasks)."""
    suite = suite or SUITES["toy"]
    if row in SFT_ROWS:
        return f"- (SFT on expert; {SFT_ROWS[row]} is the RL-from-base row)"
    if len(s["final"]) < 3:
        return f"not judged ({len(s['final'])} of 3 seeds)"
    rl, base, expert = statistics.mean(s["final"]), statistics.mean(s["base"]), s["expert"]["success"]
    tasks = s.get("eval_tasks") or s["expert"].get("episodes") or 16
    n_rl, n_base = tasks * EVAL_EPISODES * len(s["final"]), tasks * EVAL_EPISODES * len(s["base"])
    bars = [(f"base + {suite.gain:g}", rl - base - suite.gain, noise(rl, n_rl, base, n_base))]
    share = suite.expert_share
    if expert and share is not None:
        bars.append(
            (
                f"{share:g} expert",
                rl - share * expert,
                noise(rl, n_rl, expert, s["expert"].get("episodes") or tasks, share),
            )
        )
    for name, gap, margin in bars:
        if gap >= margin:
            return f"yes (>= {name})"
    near = [b for b in bars if abs(b[1]) < b[2]]
    if near:
        name, gap, margin = max(near, key=lambda b: b[1])
        return f"borderline ({gap:+.3f} of {name}, within the noise ±{margin:.2f})"
    return "no"


def overlap_cell(row: str, folder: Path) -> str:
    """The held-out tasks each finished seed also drew in training (bench/task_overlap.py)."""
    try:
        res = row_overlap(row, folder)
    except (ImportError, OSError, RuntimeError) as exc:  # an env that needs what this machine lacks
        return f"not replayed ({type(exc).__name__})"
    if not res:
        return "-"
    tasks = {r["test_tasks"] for r in res.values()}
    return "/".join(str(r["overlap"]) for r in res.values()) + f" of {'/'.join(str(t) for t in sorted(tasks))}"


def table(
    out: Path, rows: list[str], record: Path = RECORD, kept: dict[str, str] | None = None, suite: Suite | None = None
) -> str:
    """The table of ``rows`` from their runs (``where``); a row with none keeps its line in
    ``kept`` (the page's current table), if any."""
    lines = [
        "| env (config) | random | base | base + RL: mean ± sd (min-max) | expert | RL steps | wall per RL run (s) | "
        "turn limit | test tasks also drawn in training, per seed | meets the bar |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    suite = suite or SUITES["toy"]
    missing = []
    for row in rows:
        folder = where(out, record, row)
        s = summarise(folder)
        if s is None and row in (kept or {}):
            line = kept[row]
            if NO_RECORD not in line:  # the name cell says that the line cannot be rebuilt
                cells = line.split("|")
                cells[1] = f" {cells[1].strip()}: {NO_RECORD} "
                line = "|".join(cells)
            lines.append(line)
            if "not judged" in kept[row]:
                missing.append(row)
            continue
        if s is None or len(s["final"]) < 3:
            missing.append(row)
        if s is None:
            continue
        steps = "/".join(str(n) for n in s["steps"]) or "-"
        wall = "/".join(f"{w:.0f}" for w in s["wall_s"]) or "-"
        name = f"{row}: base = SFT on expert, + RL = SFT + RL" if row in SFT_ROWS else row
        name = f"{name}: {ROW_NOTES[row]}" if row in ROW_NOTES else name
        base_cell = f"{s['base'][0]:.2f} (zero-shot arm, no RL run)" if s.get("base_alone") else _ms(s["base"])
        lines.append(
            f"| {name} | {s['random']['success']:.2f} | {base_cell} | {_ms(s['final'])} | "
            f"{s['expert']['success']:.2f} | {steps} | {wall} | {s['random']['turn_limit']} | "
            f"{overlap_cell(row, folder)} | {verdict(s, row, suite)} |"
        )
    if missing:
        lines.append("")
        lines.append(
            f"Rows without 3 finished RL seeds: {', '.join(missing)}. To run them: "
            f"`{suite.command.format(rows=','.join(missing))}`"
        )
    return "\n".join(lines)


BEGIN, END = "<!-- results-table -->", "<!-- /results-table -->"
SUITES = {
    "toy": Suite(ROWS, (BEGIN, END), 0.3, 0.8, COMMAND),
    "real": Suite(
        REAL_ROWS,
        ("<!-- real-table -->", "<!-- /real-table -->"),
        0.15,
        None,
        "nice python bench/results.py --suite real --rows {rows} --seeds 0,1,2 --steps 40 --max-wall-s 2700 "
        "--engine vllm --table docs/results.md --plot docs/img/results_real.png",
    ),
}
"""The tables: the demo models' (``toy``, the bar base + 0.3 or 0.8 of the expert) and the real
model's (``real``, the bar base + 0.15 over the instruct model zero-shot)."""


def page_lines(path: Path, markers: tuple[str, str] = (BEGIN, END)) -> dict[str, str]:
    """Row -> its line in the table already on the page at ``path`` (between the markers)."""
    BEGIN, END = markers  # noqa: N806
    page = path.read_text() if path.exists() else ""
    if BEGIN not in page or END not in page:
        return {}
    body = page.split(BEGIN, 1)[1].split(END, 1)[0]
    # A labelled row's cell is "row: what its arms are".
    return {
        line.split("|")[1].split(":", 1)[0].strip(): line
        for line in body.splitlines()
        if line.startswith("| ") and line.count("|") > 3
    }


def write_table(path: Path, text: str, markers: tuple[str, str] = (BEGIN, END)) -> None:
    """Put ``text`` between the markers of ``path`` (the page around it is kept), or write it as
    the whole file when it has no markers."""
    BEGIN, END = markers  # noqa: N806
    page = path.read_text() if path.exists() else ""
    if BEGIN in page and END in page:
        head, rest = page.split(BEGIN, 1)
        page = f"{head}{BEGIN}\n{text}\n{END}{rest.split(END, 1)[1]}"
    else:
        page = f"{BEGIN}\n{text}\n{END}\n"
    path.write_text(page)


def plot(out: Path, rows: list[str], path: Path, record: Path = RECORD) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folders = {r: where(out, record, r) for r in rows}
    summaries = {r: summarise(folders[r]) for r in rows}
    done = [r for r in rows if summaries[r] is not None]
    if not done:
        return
    cols = min(3, len(done))
    fig, axes = plt.subplots(
        (len(done) + cols - 1) // cols,
        cols,
        figsize=(4.2 * cols, 3.0 * ((len(done) + cols - 1) // cols)),
        squeeze=False,
    )
    for ax, row in zip(axes.flat, done):
        s = summaries[row]
        for f in sorted(folders[row].glob("seed*.json")):
            c = json.loads(f.read_text())["curve"]
            ax.plot([p[0] for p in c], [p[1] for p in c], lw=1.2, label=f.stem)
        ax.axhline(s["expert"]["success"], color="green", ls="--", lw=0.8, label="expert")
        ax.axhline(s["random"]["success"], color="grey", ls=":", lw=0.8, label="random")
        ax.set_title(row, fontsize=9)
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("learner step", fontsize=8)
        ax.set_ylabel("held-out success", fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(done) :]:
        ax.set_visible(False)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"wrote {path}")


def mix_curves(run_dir: Path, path: Path, every: int = 10) -> None:
    """Per env of an ``agentgym train`` run on a mix: its held-out success at each evaluation
    (``eval.jsonl``) and its training success, the mean of each ``every`` steps it was played in
    (``metrics.jsonl``), side by side. ``run_dir`` may be a run or its record (docs/results-data)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def jsonl(name: str) -> list[dict]:
        f = run_dir / name
        return [json.loads(line) for line in f.read_text().splitlines() if line.strip()] if f.exists() else []

    evals, steps = jsonl("eval.jsonl"), jsonl("metrics.jsonl")
    envs = sorted(
        {k.split("/")[1] for r in evals + steps for k in r if k.startswith("env/") and k.endswith("/success_rate")}
    )
    if not envs:
        raise SystemExit(f"results: --mix-curves: {run_dir} has no per-env success in eval.jsonl or metrics.jsonl")
    fig, (held, train) = plt.subplots(1, 2, figsize=(11, 4.0), sharey=True)
    for env in envs:
        key = f"env/{env}/success_rate"
        pts = [(e["step"], e[key]) for e in evals if key in e]
        line = held.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=env)[0]
        played = [(r["step"], r[key]) for r in steps if r.get(f"env/{env}/episodes", 0) > 0 and key in r]
        chunks = [played[i : i + every] for i in range(0, len(played), every)]
        means = [(c[-1][0], sum(v for _, v in c) / len(c)) for c in chunks]  # at the chunk's last step
        train.plot([m[0] for m in means], [m[1] for m in means], color=line.get_color(), label=env)
        print(
            f"{env}: held-out "
            + ", ".join(f"step {s} {v:.2f}" for s, v in pts)
            + f"; training, mean of each {every} steps: "
            + ", ".join(f"{v:.2f}" for _, v in means)
        )
    for ax, title in ((held, "held-out success"), (train, f"training success (mean of {every} steps)")):
        ax.set_xlabel("learner step")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    held.set_ylim(0, 1.02)
    held.set_ylabel("success")
    held.legend(fontsize=8)
    fig.suptitle(f"one model on the mix ({run_dir.name})", fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"wrote {path}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--suite", choices=list(SUITES), default="toy", help="which table: the demo models' or the real model's"
    )
    p.add_argument("--rows", default="", help=f"comma-separated rows to run, or 'all' ({', '.join(ROWS + REAL_ROWS)})")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--steps", type=int, default=100, help="RL steps per run (at most)")
    p.add_argument(
        "--max-wall-s", type=float, default=1200.0, help="wall time per RL run before it stops and evaluates"
    )
    p.add_argument("--eval-every", type=int, default=20)
    p.add_argument(
        "--eval-tasks",
        type=int,
        default=None,
        help="held-out test tasks (x4 samples for the model arms); default: the row config's eval.tasks",
    )
    p.add_argument("-o", "--override", action="append", default=[], help="config override for every row's runs")
    p.add_argument(
        "--engine",
        choices=("hf", "vllm"),
        default="hf",
        help="the RL runs' engine: hf (reference, exact logprobs) or vllm (batched, ~2.5x faster on maze here)",
    )
    p.add_argument(
        "--overlap",
        action="store_true",
        help="play the next batch while the trainer steps (every batch one version stale; bench/learn_curve.py)",
    )
    p.add_argument("--out", type=Path, default=REPO / "runs" / "results")
    p.add_argument("--table", type=Path, default=None, help="write the table here (default: print it)")
    p.add_argument("--plot", type=Path, default=None, help="draw the held-out curves here (png)")
    p.add_argument(
        "--record",
        type=Path,
        default=RECORD,
        help="the committed record: --table-only copies --out's rows here and reads it for the others",
    )
    p.add_argument("--table-only", action="store_true", help="run nothing: rebuild the table and plot from --out")
    p.add_argument("--arms-only", action="store_true", help="only the random and expert arms (no model, no RL)")
    p.add_argument(
        "--zero-shot",
        action="store_true",
        help="the random and expert arms and the model as it is (no RL): the base of a row not trained yet",
    )
    p.add_argument(
        "--mix-curves",
        type=Path,
        default=None,
        metavar="RUN_DIR",
        help="instead: plot the per-env held-out curves of an `agentgym train` run on a mix to --plot",
    )
    args = p.parse_args()
    if args.mix_curves:
        mix_curves(args.mix_curves, args.plot or args.mix_curves / "env_curves.png")
        return 0
    suite = SUITES[args.suite]
    rows = list(suite.rows) if args.rows == "all" else [r for r in args.rows.split(",") if r]
    for row in rows:
        if row not in suite.rows:
            raise SystemExit(
                f"results: --rows: unknown row {row!r} of --suite {args.suite}; its rows are {', '.join(suite.rows)}"
            )
    if not args.table_only:
        if not rows:
            raise SystemExit("results: give --rows (or --table-only)")
        for row in rows:
            run_row(row, [int(s) for s in args.seeds.split(",")], args)
    if args.table_only:
        for row in suite.rows:
            save_record(args.out, args.record, row)
    text = table(
        args.out, list(suite.rows), args.record, page_lines(args.table, suite.markers) if args.table else None, suite
    )
    if args.table:
        write_table(args.table, text, suite.markers)
        print(f"wrote {args.table}")
    else:
        print(text)
    if args.plot:
        plot(args.out, list(suite.rows), args.plot, args.record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
