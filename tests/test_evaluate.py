"""``agentgym eval`` and its metrics: pass@k against hand-computed values, and the same command
run twice (hf engine, tiny model, real env pool) giving identical numbers and episodes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentgym.observe.eval_metrics import episode_seed, pass_at_k, summarize


def test_pass_at_k_hand_computed() -> None:
    assert pass_at_k(5, 0, 1) == 0.0
    assert pass_at_k(5, 5, 3) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)  # c / n
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)  # 1 - C(3,2)/C(4,2)
    assert pass_at_k(5, 2, 3) == pytest.approx(1 - 1 / 10)  # 1 - C(3,3)/C(5,3)
    assert pass_at_k(3, 1, 3) == 1.0  # n - c < k: every draw of 3 holds the success
    with pytest.raises(ValueError, match="n=2 c=3"):
        pass_at_k(2, 3, 1)
    with pytest.raises(ValueError, match="k=3"):
        pass_at_k(2, 1, 3)


def test_summarize_averages_over_tasks() -> None:
    out = summarize({"maze": [[True, False, False, False], [True, True, False, False]]}, k=2)
    m = out["maze"]
    assert (m["tasks"], m["samples"]) == (2, 8)
    assert m["avg@2"] == pytest.approx((0.25 + 0.5) / 2)
    assert m["pass@2"] == pytest.approx(((1 - 3 / 6) + (1 - 1 / 6)) / 2)
    with pytest.raises(ValueError, match="fewer than k=3"):
        summarize({"maze": [[True, False]]}, k=3)


def test_episode_seed_depends_on_identity_only() -> None:
    assert episode_seed(0, "maze", 1, 2) == episode_seed(0, "maze", 1, 2)
    assert len({episode_seed(0, "maze", t, s) for t in range(10) for s in range(10)}) == 100
    assert episode_seed(1, "maze", 1, 2) != episode_seed(0, "maze", 1, 2)
    assert 0 <= episode_seed(7, "x", 3, 4) < 2**30


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    from agentgym.models.tiny import make_tiny_model

    corpus = ["guess a number from 1 to 8", "higher", "lower", "correct", *map(str, range(1, 9))]
    return make_tiny_model(tmp_path_factory.mktemp("m") / "tiny", corpus=corpus, seed=0)


def _eval(model: Path, out: Path, *extra: str) -> dict:
    from agentgym.cli.main import main

    rc = main(
        [
            "eval",
            "--model",
            str(model),
            "--engine",
            "hf",
            "--env",
            "guess_number",
            "--tasks",
            "2",
            "-k",
            "3",
            "--turn-limit",
            "3",
            "-o",
            "rollout.max_tokens_per_turn=3",
            "--out",
            str(out),
            *extra,
        ]
    )
    assert rc == 0
    return json.loads(out.read_text())


def test_eval_is_reproducible_and_seeded(tiny: Path, tmp_path: Path) -> None:
    a = _eval(tiny, tmp_path / "a.json", "--temperature", "1.0", "--seed", "3")
    b = _eval(tiny, tmp_path / "b.json", "--temperature", "1.0", "--seed", "3", "--concurrency", "2")
    assert a["envs"] == b["envs"] and a["episodes"] == b["episodes"]  # interleaving does not matter
    assert len(a["episodes"]) == 6 and a["envs"]["guess_number"]["samples"] == 6
    row = a["envs"]["guess_number"]
    by_task = [[e["success"] for e in a["episodes"] if e["task"] == t] for t in range(2)]
    assert row["avg@3"] == pytest.approx(sum(sum(s) / 3 for s in by_task) / 2)
    assert row["pass@3"] == pytest.approx(sum(any(s) for s in by_task) / 2)
    # Greedy: the k samples of a task are the same episode.
    g = _eval(tiny, tmp_path / "g.json", "--temperature", "0")
    for t in range(2):
        eps = [(e["reward"], e["finish"], e["success"]) for e in g["episodes"] if e["task"] == t]
        assert len(set(eps)) == 1


def test_eval_rejects_bad_input(tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from agentgym.cli.main import main

    assert main(["eval", "--model", str(tmp_path), "--env", "guess_number"]) == 2
    assert "no config.json" in capsys.readouterr().err
    assert main(["eval", "--model", str(tiny), "--env", "no_such_env"]) == 2
    assert "no_such_env" in capsys.readouterr().err
    assert main(["eval", "--model", str(tiny), "-k", "0"]) == 2
    assert "-k must be >= 1" in capsys.readouterr().err


def test_summarize_groups_is_what_the_learner_writes() -> None:
    from agentgym.observe.eval_metrics import summarize_groups

    out = summarize_groups([[True, False], [False, False], [True]], k=2)  # the short group is left out
    assert (out["tasks"], out["avg@2"], out["pass@2"]) == (2, 0.25, 0.5)
    assert summarize_groups([[True]], k=2) == {}


def test_eval_with_and_without_the_critic(tiny: Path, tmp_path: Path) -> None:
    # The same seeded tasks: alone (no critique anywhere, even with critic.enabled in the config)
    # and with the oracle speaking after each unrewarded step of the held-out episodes.
    oracle = ("-o", "critic.enabled=true", "-o", 'critic.kind="oracle"', "-o", 'critic.when="after_failure"')
    alone = _eval(tiny, tmp_path / "alone.json", "--seed", "1", *oracle)
    helped = _eval(tiny, tmp_path / "helped.json", "--seed", "1", "--critic", *oracle)
    assert alone["critic"] is None and all(e["critiques"] == 0 for e in alone["episodes"])
    assert helped["critic"] == "oracle after_failure"
    failed_steps = [e for e in helped["episodes"] if not e["success"]]
    assert failed_steps and all(e["critiques"] >= 1 for e in failed_steps)  # 3 turns, none solved: >= 1 critique
