"""What the agent did: the learner's episode log (learner/records/episode_log.py) cuts real episodes into
the segments it trains on and decodes them with the model's tokenizer; ``agentgym view`` turns a
run directory into a page that a real headless Chromium renders (episodes, filters, curves)."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from learner_fixtures import episode

from agentgym.learner.records.episode_log import EpisodeLog, pick_episodes
from agentgym.models.tiny import FALLBACK_CORPUS, make_tiny_model
from agentgym.observe.logs import MetricsWriter, read_metrics
from agentgym.observe.viewer import write_page
from agentgym.protocol import Rollout

REPO = Path(__file__).resolve().parents[1]
HOSTILE = "</script><b id=injected>bold</b>"  # an environment message that is also HTML


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("viewer") / "m", corpus=FALLBACK_CORPUS, seed=0)


@pytest.fixture(scope="module")
def tok(model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def _ids(tok, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False))


def _rollouts(tok) -> list[Rollout]:
    """Two groups of real token ids: a prompt, agent turns and environment messages between them."""
    prompt = _ids(tok, "guess a number from 1 to 8")
    env_msg, hostile = _ids(tok, " higher "), _ids(tok, HOSTILE)
    win = episode(prompt, [_ids(tok, "4"), _ids(tok, "6")], [0.0, 1.0], version=3, between=env_msg)
    lose = episode(
        prompt, [_ids(tok, "2"), _ids(tok, "3")], [0.0, 0.0], version=2, between=hostile, finish="turn_limit"
    )
    mid = episode(prompt, [_ids(tok, "5")], [0.5], version=3, between=env_msg)
    return [
        Rollout(group_id="run:1", actor_id="actor-a", env="guess_number", task_id=7, episodes=[lose, win, mid]),
        Rollout(group_id="run:2", actor_id="actor-b", env="maze", task_id=2, episodes=[mid, lose]),
    ]


def test_episodes_are_picked_best_and_worst_and_cut_into_the_segments_trained_on(
    model_dir: Path, tok, tmp_path: Path
) -> None:
    rollouts = _rollouts(tok)
    # pick k: group k mod 2, the best episode for even k, the worst for odd k; no repeats
    assert [(r.group_id, i) for r, i in pick_episodes(rollouts, 3)] == [("run:1", 1), ("run:2", 1), ("run:1", 0)]
    assert pick_episodes(rollouts, 0) == [] and pick_episodes([], 3) == []

    log = EpisodeLog(tmp_path / "episodes.jsonl", model_dir, per_step=3)
    assert log.write("train", 5, 5, rollouts) == 3
    log.close()
    recs = read_metrics(tmp_path / "episodes.jsonl")
    assert [(r["group_id"], r["episode"], r["success"]) for r in recs] == [
        ("run:1", 1, True),
        ("run:2", 1, False),
        ("run:1", 0, False),
    ]
    win, lose = recs[0], recs[2]
    assert (win["kind"], win["step"], win["env"], win["task_id"], win["actor_id"]) == (
        "train",
        5,
        "guess_number",
        7,
        "actor-a",
    )
    assert (win["finish"], lose["finish"], win["turns"], win["turn_limit"]) == ("done", "turn_limit", 2, 2)
    assert win["group_reward_mean"] == pytest.approx(0.5)
    segs = win["segments"]
    assert [s["role"] for s in segs] == ["prompt", "agent", "env", "agent", "env"]
    assert [s["text"] for s in segs] == [
        tok.decode(_ids(tok, t)) for t in ("guess a number from 1 to 8", "4", " higher ", "6", " higher ")
    ]
    assert sum(s["tokens"] for s in segs) == win["tokens"]
    agent = [s for s in segs if s["role"] == "agent"]
    assert [(s["turn"], s["reward"], s["versions"]) for s in agent] == [(0, 0.0, [3, 3]), (1, 1.0, [3, 3])]
    assert [s["text"] for s in lose["segments"] if s["role"] == "env"] == [HOSTILE, HOSTILE]


def _chromium_dom(page: Path, query: str, profile: Path) -> str:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed (scripts/system-packages.txt installs it)")
    cmd = [
        chromium,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        f"--user-data-dir={profile}",
        "--dump-dom",
        page.as_uri() + query,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_agentgym_view_writes_a_page_chromium_renders_with_filters_and_curves(
    model_dir: Path, tok, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    log = EpisodeLog(run / "episodes.jsonl", model_dir, per_step=2)
    for step in (1, 2, 3):
        log.write("train", step, step, _rollouts(tok))
    log.write("eval", 3, 3, _rollouts(tok)[:1])
    log.close()
    metrics, evals = MetricsWriter(run / "metrics.jsonl"), MetricsWriter(run / "eval.jsonl")
    for step in (1, 2, 3):
        metrics.write(
            {
                "step": step,
                "success_rate": 0.1 * step,
                "reward_mean": 0.2 * step,
                "loss": 1.0,
                "entropy": 2.0 - step * 0.1,
                "is_weight_max": 1.5,
                "staleness_mean": 0.5,
            }
        )
    evals.write({"step": 3, "version": 3, "success_rate": 0.3, "split": "test", "episodes": 8})  # one point
    metrics.close()
    evals.close()
    (run / "metrics.jsonl").open("a").write('{"step": 4, "succ')  # a run still writing: torn last line

    proc = subprocess.run(
        [sys.executable, "-m", "agentgym.cli", "view", str(run)], capture_output=True, text=True, cwd=REPO
    )
    assert proc.returncode == 0, proc.stderr
    page = Path(proc.stdout.strip())
    assert page == run / "view.html" and page.is_file()
    html = page.read_text()
    assert HOSTILE not in html  # the data sits in the page as JSON with "<" escaped

    dom = _chromium_dom(page, "", tmp_path / "profile")
    assert dom.count('class="ep"') == 8  # 3 steps x 2 + the best and the worst of 1 eval group
    assert "8 of 8 episodes" in dom and "3 optimizer steps, 1 evaluations, 8 logged episodes" in dom
    # the environment's HTML shows as text, and made no element
    assert 'id="injected"' not in dom and "&lt;/script&gt;&lt;b id=injected&gt;bold&lt;/b&gt;" in dom
    # success (training, held-out), reward, and loss, entropy, importance weight max, staleness
    assert dom.count('class="series"') == 7
    assert dom.count('class="point"') == 1 and 'class="point" data-name="eval"' in dom  # the single evaluation
    for title in ("success rate", "mean reward", "loss", "entropy", "importance weight (max)", "staleness (versions)"):
        assert f'class="chart-title">{title} <' in dom, title
    assert 'id="c-kl_ref"' not in dom  # absent from the metrics: no empty chart
    assert "agent, turn 2 · reward 1 · version 3 · mean logprob 0 · 1 tokens" in dom

    failures = _chromium_dom(page, "?outcome=failure&kind=train", tmp_path / "profile")
    assert failures.count('class="ep"') == 3 and "3 of 8 episodes" in failures
    evals_only = _chromium_dom(page, "?kind=eval", tmp_path / "profile")
    assert evals_only.count('class="ep"') == 2
    nothing = _chromium_dom(page, "?q=no%20such%20words", tmp_path / "profile")
    assert nothing.count('class="ep"') == 0 and "no episode matches" in nothing


def test_agentgym_view_names_what_is_missing(tmp_path: Path) -> None:
    for target, msg in ((tmp_path / "nope", "is not a directory"), (tmp_path, "has none of episodes.jsonl")):
        proc = subprocess.run(
            [sys.executable, "-m", "agentgym.cli", "view", str(target)], capture_output=True, text=True, cwd=REPO
        )
        assert proc.returncode == 2 and msg in proc.stderr, proc.stderr
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    proc = subprocess.run(
        [sys.executable, "-m", "agentgym.cli", "view", str(tmp_path)], capture_output=True, text=True, cwd=REPO
    )
    assert proc.returncode == 2 and "metrics.jsonl:2: not a JSON line" in proc.stderr, proc.stderr


def _layout(dom: str) -> list[dict]:
    m = re.search(r'<pre id="layout" hidden="">(.*?)</pre>', dom, re.S)
    assert m, "the page wrote no layout"
    return json.loads(html.unescape(m.group(1)))


def _overlap(a: dict, b: dict) -> bool:
    return (
        a["x"] < b["x"] + b["w"] and b["x"] < a["x"] + a["w"] and a["y"] < b["y"] + b["h"] and b["y"] < a["y"] + a["h"]
    )


def test_charts_have_legible_axes_fitted_ranges_smoothing_and_hover(tmp_path: Path) -> None:
    """A run's real metric names (learner/training/trainer.py, learner/control/evaluation.py) drawn as TensorBoard
    would: every label inside its chart and clear of every other, ranges fitted to the data."""
    run = tmp_path / "run"
    metrics, evals = MetricsWriter(run / "metrics.jsonl"), MetricsWriter(run / "eval.jsonl")
    for s in range(1, 121):
        metrics.write(
            {
                "step": s,
                "success_rate": min(1.0, 0.1 + s / 150),
                "reward_mean": 0.2 + s / 300,
                "trajectories_per_s": 38 + s % 7,
                "tokens_per_s": 210 + 3 * (s % 5),
                "turn_limit": 4 if s < 40 else 6,
                "loss": 0.05 / s,
                "grad_norm": 1.5 + 0.1 * (s % 3),
                "lr": 1e-2 * (1 - s / 150),
                "clip_frac": 0.02 * (s % 2),
                "approx_kl": 1e-4 + 1e-6 * (s % 4),
                "is_weight_mean": 1.0 + 0.001 * (s % 3 - 1),
                "env/guess_number/success_rate": 0.3 + s / 250,
                "env/maze/success_rate": 0.05 + s / 400,
                "env/guess_number/turn_limit": 4 if s < 40 else 6,
                "env/maze/turn_limit": 4,
                "kl_ref": float("nan"),
            }
        )
    for s in (0, 60, 120):
        evals.write(
            {
                "step": s,
                "version": s,
                "success_rate": 0.1 + s / 400,
                "reward_mean": 0.1 + s / 400,
                "avg@8": 0.1 + s / 400,
                "pass@8": 0.3 + s / 300,
                "env/guess_number/success_rate": 0.2,
                "env/maze/success_rate": 0.1,
            }
        )
    metrics.close()
    evals.close()
    page = write_page(run)

    dom = _chromium_dom(page, "?hover=60", tmp_path / "profile")
    charts = {c["id"]: c for c in _layout(dom)}
    want = [
        "c-success",
        "c-reward",
        "c-success_by_env",
        "c-eval_k",
        "c-throughput",
        "c-tokens",
        "c-turn_limit",
        "c-loss",
        "c-grad_norm",
        "c-lr",
        "c-clip_frac",
        "c-approx_kl",
        "c-is_weight_mean",
    ]
    assert list(charts) == want
    for c in charts.values():
        texts = c["texts"]
        ticks_y = [t for t in texts if t["text"] != "step" and t["x"] + t["w"] < 80]
        ticks_x = [t for t in texts if t["y"] > c["height"] - 40 and t["text"] != "step"]
        assert len(ticks_y) >= 3 and len(ticks_x) >= 3, (c["id"], texts)  # ticks, not just min and max
        for t in texts:
            assert (
                t["w"] > 0
                and 0 <= t["x"]
                and t["x"] + t["w"] <= c["width"]
                and 0 <= t["y"]
                and t["y"] + t["h"] <= c["height"]
            ), (c["id"], t)
        for i, a in enumerate(texts):
            for b in texts[i + 1 :]:
                assert not _overlap(a, b), (c["id"], a, b)
    # the y range fits the data: importance weights near 1 do not start the axis at 0
    ys = [float(t["text"]) for t in charts["c-is_weight_mean"]["texts"] if t["text"] != "step" and t["x"] < 60]
    assert 0.99 <= min(ys) < 0.999 and 1.001 < max(ys) <= 1.01, ys
    # a rate's axis stops at 1; tiny values get a readable shared notation
    assert max(float(t["text"]) for t in charts["c-success"]["texts"] if t["x"] < 40) == 1.0
    assert any("e-" in t["text"] for t in charts["c-approx_kl"]["texts"])
    # hover: the crosshair's values at step 60, training smoothed (with the raw value) and evaluations as logged
    tips = re.findall(r'<div class="tip"[^>]*>(.*?)</div></div>', dom)
    assert len(tips) == len(want)
    assert "step 60" in tips[0] and "eval 0.2500" in tips[0] and "(raw 0.5000)" in tips[0]
    assert "avg@8 0.2500" in dom and "pass@8 0.5000" in dom
    assert (
        dom.count('class="raw"') == 11
    )  # each smoothed training series keeps its raw curve (turn limit, lr: not smoothed)
    flat = _chromium_dom(page, "?smooth=0", tmp_path / "profile")
    assert 'class="raw"' not in flat and 'class="tip" hidden' in flat
    # a run with nothing to draw yet (NaN only, no evaluation): the page still renders, hover or not
    empty = tmp_path / "empty"
    w = MetricsWriter(empty / "metrics.jsonl")
    w.write({"step": 1, "loss": float("nan")})
    w.close()
    dom = _chromium_dom(write_page(empty), "?hover=1", tmp_path / "profile")
    assert [c["id"] for c in _layout(dom)] == ["c-success", "c-reward"] and dom.count(">no data yet</text>") == 2
