"""The results table's record (bench/results.py): what a run wrote is copied to the committed
record without its transcripts, and the table is the same whether it is rebuilt from the runs or
from the record alone; a row in neither keeps the page's line and says so. A verdict within the
noise of the bar is "borderline", and the held-out tasks each run also drew in training are found
by replaying its draws (bench/task_overlap.py)."""

from __future__ import annotations

import importlib
import json
import random
from pathlib import Path

import pytest

from agentgym.config import load_config
from agentgym.learner.control.scheduler import Scheduler


@pytest.fixture
def results(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "bench"))
    return importlib.import_module("results")


def _row(folder: Path, finals: list[float]) -> None:
    folder.mkdir(parents=True)
    arm = {"success": 0.1, "turn_limit": 8}
    (folder / "arms.json").write_text(json.dumps({"random": arm, "expert": {**arm, "success": 1.0}}))
    for seed, final in enumerate(finals):
        metrics = [{"success_rate": 0.2 + i / 100, "entropy": 0.5, "pg_loss": 0.1, "tokens": 99} for i in range(4)]
        run = {
            "curve": [[0, 0.2], [4, final]],
            "metrics": metrics,
            "plays": [["a long transcript"] * 50],
            "wall_s": 100.0 + seed,
            "seed": seed,
        }
        (folder / f"seed{seed}.json").write_text(json.dumps(run))


def test_the_record_rebuilds_the_same_table_and_keeps_rows_it_has_not(results, tmp_path: Path) -> None:
    out, record, page = tmp_path / "runs", tmp_path / "record", tmp_path / "results.md"
    _row(out / "maze5", [0.5, 0.6, 0.7])
    page.write_text(
        f"intro\n{results.BEGIN}\n| env | a |\n|---|---|\n| wordle | 0.17 | old line |\n| textcraft2 | 0.00 | not judged (0 of 3 seeds) |\n{results.END}\nafter\n"
    )
    kept = results.page_lines(page)
    assert list(kept) == ["wordle", "textcraft2"]
    from_runs = results.table(out, ["maze5", "wordle", "textcraft2", "babyai"], record, kept)
    for row in results.ROWS:
        results.save_record(out, record, row)
    seed0 = json.loads((record / "maze5" / "seed0.json").read_text())
    assert "plays" not in seed0 and seed0["steps"] == 4
    assert seed0["metrics"][3] == {"success_rate": 0.23, "entropy": 0.5}  # only RECORD_METRICS
    assert not (record / "wordle").exists()  # nothing to copy
    from_record = results.table(tmp_path / "elsewhere", ["maze5", "wordle", "textcraft2", "babyai"], record, kept)
    assert from_record == from_runs
    lines = from_record.splitlines()
    assert lines[2].startswith("| maze5 | 0.10 |") and "0.60 ± 0.10 (0.50-0.70)" in lines[2] and "yes" in lines[2]
    assert "| 0/0/0 of 32 |" in lines[2]  # 4 steps of 16 draws on 5x5 mazes: no held-out maze among them
    assert lines[3] == f"| wordle: {results.NO_RECORD} | 0.17 | old line |"  # kept from the page, and says so
    assert lines[4] == f"| textcraft2: {results.NO_RECORD} | 0.00 | not judged (0 of 3 seeds) |"
    assert "Rows without 3 finished RL seeds: textcraft2, babyai." in from_record  # a kept line not judged too
    results.write_table(page, from_record)
    text = page.read_text()
    assert text.startswith("intro\n") and text.endswith("after\n") and text.count(results.BEGIN) == 1


def test_mix_curves_draw_each_env_of_a_mix_run_from_its_record(
    results, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The committed record of configs/envs/mix.toml's run (docs/results-data/mix-games): one
    held-out curve and one training curve per env, with the values the run wrote."""
    record = Path(__file__).parents[1] / "docs" / "results-data" / "mix-games"
    evals = [json.loads(line) for line in (record / "eval.jsonl").read_text().splitlines()]
    png = tmp_path / "mix.png"
    results.mix_curves(record, png, every=10)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    lines = {line.split(":")[0]: line for line in capsys.readouterr().out.splitlines() if "held-out" in line}
    assert sorted(lines) == ["babyai", "guess_number", "maze", "textcraft", "wordle"]  # the config's envs
    for env, line in lines.items():
        held = ", ".join(f"step {e['step']} {e[f'env/{env}/success_rate']:.2f}" for e in evals)
        assert f"held-out {held};" in line, line
        assert len(line.split("steps: ")[1].split(", ")) == 6  # 60 steps, 6 means of 10
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="no per-env success"):
        results.mix_curves(tmp_path / "empty", png)


def test_an_sft_row_is_labelled_never_judged_and_kept_by_its_name(results, tmp_path: Path) -> None:
    """A row whose model learnt from the expert ("SFT on expert", then "SFT + RL") says so in its
    name cell and is not judged by the bar, which is for RL from a base model."""
    out, page = tmp_path / "runs", tmp_path / "results.md"
    _row(out / "textcraft1-sft", [0.9, 0.9, 0.9])  # far above base + 0.3 and 0.8 of the expert
    text = results.table(out, ["textcraft1-sft"], tmp_path / "record")
    line = text.splitlines()[2]
    assert line.startswith("| textcraft1-sft: base = SFT on expert, + RL = SFT + RL | 0.10 |"), line
    assert "yes" not in line and line.endswith("| - (SFT on expert; textcraft1 is the RL-from-base row) |"), line
    page.write_text(f"{results.BEGIN}\n{text}\n{results.END}\n")
    assert results.page_lines(page)["textcraft1-sft"] == line
    assert set(results.SFT_ROWS) <= set(results.ROWS) and set(results.SFT_ROWS.values()) <= set(results.ROWS)


def test_a_verdict_within_the_noise_of_the_bar_is_borderline(results) -> None:
    """maze3's figures (32 tasks x 4 x 3 seeds an arm): +0.305 over the base meets base + 0.3 by
    0.005, inside the ±0.07 that two such evaluations differ by; a clear margin is "yes", a clear
    miss "no"."""

    def row(base: list[float], final: list[float]) -> dict:
        return {"base": base, "final": final, "eval_tasks": 32, "expert": {"success": 1.0, "episodes": 32}}

    maze3 = results.verdict(row([0.289, 0.305, 0.328], [0.578, 0.508, 0.75]))
    assert maze3 == "borderline (+0.005 of base + 0.3, within the noise ±0.07)", maze3
    assert results.verdict(row([0.3] * 3, [0.25] * 3)) == "no"
    assert results.verdict(row([0.3] * 3, [0.45] * 3)) == "no"
    assert results.verdict(row([0.3] * 3, [0.59] * 3)).startswith("borderline (-0.010 of base + 0.3")
    assert results.verdict(row([0.3] * 3, [0.7] * 3)) == "yes (>= base + 0.3)"
    assert (
        results.verdict(row([0.6] * 3, [0.95] * 3)) == "yes (>= 0.8 expert)"
    )  # +0.05 over base + 0.3 is within its noise
    assert results.verdict(row([0.7] * 3, [0.9] * 3)) == "yes (>= 0.8 expert)"
    assert results.verdict(row([0.7] * 3, [0.82] * 3)).startswith("borderline (+0.020 of 0.8 expert")


def test_replayed_draws_find_the_held_out_tasks_a_run_trained_on(results) -> None:
    """bench/task_overlap.py replays a run's training draws (learn_curve's ``train_task_ids``) and
    compares tasks by what the env holds and shows, not by id: maze3's committed runs drew 14, 19
    and 16 of its 32 test mazes (the same layout, start and goal under another id); Wordle held
    out by word never draws a test word, and held out by game every test game is a training game."""
    import task_overlap

    record = Path(__file__).parents[1] / "docs" / "results-data"
    maze3 = task_overlap.row_overlap("maze3", record / "maze3")
    assert {seed: r["overlap"] for seed, r in maze3.items()} == {0: 14, 1: 19, 2: 16}
    assert {r["test_tasks"] for r in maze3.values()} == {32}
    assert maze3[0]["drawn"] == 80 * 32  # 80 steps of 32 groups
    by_word = task_overlap.overlap(results.config("wordle", 0, []), steps=10, eval_tasks=16)
    assert by_word["overlap"] == 0 and by_word["drawn"] == 320
    by_game = task_overlap.overlap(results.config("wordle-games", 0, []), steps=3, eval_tasks=32)
    assert by_game["overlap"] == 32  # 96 draws of 16 words already hold every test game's word
    # guess_number keeps the task id (for its latency): an id is not what a task is. 1-8 has 8
    # targets, so 80 draws hold every test task's; 1-10^6 holds none.
    quick = Path(__file__).parents[1] / "configs" / "quickstart.toml"
    assert task_overlap.overlap(load_config(quick, []), steps=10, eval_tasks=16)["overlap"] == 16
    assert (
        task_overlap.overlap(load_config(quick, ["env.kwargs={low=1,high=1000000}"]), steps=10, eval_tasks=16)[
            "overlap"
        ]
        == 0
    )
    cfg = results.config("maze3", 1, [])
    draw = random.Random(1)
    steps = [task_overlap.train_task_ids(cfg.env.specs[0], cfg.learner.batch_groups, draw) for _ in range(3)]
    assert task_overlap.drawn(cfg, 3) == [t for step in steps for t in step]


def test_an_agentgym_train_runs_draws_are_its_schedulers_tickets(results) -> None:
    """``ticket_drawn`` replays learner/control/scheduler.py's tickets (env and task from the seed and the
    ticket number), env by env of a mix."""
    import task_overlap

    cfg = load_config(Path(__file__).parents[1] / "configs" / "envs" / "mix.toml", ["run.seed=3"])
    sched = Scheduler(envs=cfg.env.specs, batch_groups=4, max_staleness=1, mode="async", run_id="r", seed=3)
    issued: dict[str, list[int]] = {spec.name: [] for spec in cfg.env.specs}
    for _ in range(40):
        t = sched._new_ticket(-1)
        issued[t.env].append(t.task_id)
    assert task_overlap.ticket_drawn(cfg, 40) == issued
    assert sum(1 for ids in issued.values() if ids) >= 4  # the mix's envs, by weight


def test_the_real_models_table_has_its_own_rows_bar_place_and_record(results, tmp_path: Path) -> None:
    """--suite real: rows real/<env> from configs/real/, judged at base + 0.15 over the zero-shot
    model (no expert clause), written between their own markers beside the toy table."""
    real = results.SUITES["real"]
    assert all((results.REPO / "configs" / f"{row}.toml").exists() for row in real.rows)
    assert results.config("real/guess_number", 1, []).run.seed == 1

    def row(base: list[float], final: list[float]) -> dict:
        return {"base": base, "final": final, "eval_tasks": 16, "expert": {"success": 1.0, "episodes": 16}}

    assert results.verdict(row([0.1] * 3, [0.45] * 3), suite=real) == "yes (>= base + 0.15)"
    assert results.verdict(row([0.1] * 3, [0.12] * 3), suite=real) == "no"
    assert results.verdict(row([0.85] * 3, [0.9] * 3), suite=real) != "yes (>= 0.8 expert)"  # no expert clause
    out, record, page = tmp_path / "runs", tmp_path / "record", tmp_path / "results.md"
    _row(out / "real" / "guess_number", [0.5, 0.6, 0.7])
    page.write_text(f"toy\n{results.BEGIN}\nold toy\n{results.END}\nreal\n{real.markers[0]}\nold\n{real.markers[1]}\n")
    results.save_record(out, record, "real/guess_number")
    text = results.table(tmp_path / "elsewhere", list(real.rows), record, results.page_lines(page, real.markers), real)
    lines = text.splitlines()
    assert lines[2].startswith("| real/guess_number | 0.10 |") and lines[2].endswith("| yes (>= base + 0.15) |")
    assert "Rows without 3 finished RL seeds: real/maze3," in text and "--suite real --rows real/maze3," in text
    results.write_table(page, text, real.markers)
    assert page.read_text().startswith(f"toy\n{results.BEGIN}\nold toy\n{results.END}\nreal\n")


def test_the_ecosystem_record_rebuilds_the_table_on_the_page(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """docs/results.md's "Environments from other hubs" table is what bench/ecosystem_curves.py
    makes from the committed record alone (a fresh clone has no runs/), and each run that ended
    at its own step limit took 30 or more steps (a stopped one is labelled so in the table)."""
    repo = Path(__file__).parents[1]
    monkeypatch.syspath_prepend(str(repo / "bench"))
    eco = importlib.import_module("ecosystem_curves")
    records = eco.load_records(tmp_path / "no-runs", repo / "docs" / "results-data" / "ecosystem", write=False)
    assert records and set(records) <= set(eco.ADAPTERS)
    for r in records.values():
        assert len(r["train"]) == r["steps"] and (r["steps"] >= 30 or r["steps"] < r["max_steps"]), r["adapter"]
    page = (repo / "docs" / "results.md").read_text()
    assert eco.table(records) == page.split(eco.BEGIN, 1)[1].split(eco.END, 1)[0].strip("\n")
