"""The typed config: every file in configs/ loads, typos and bad values name the key."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from agentgym.config import Config, ConfigError, load_config, to_toml

CONFIGS = sorted((Path(__file__).parent.parent / "configs").rglob("*.toml"))


def test_there_are_configs() -> None:
    assert any(p.name == "quickstart.toml" for p in CONFIGS)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.parent.name + "/" + p.name)
def test_every_config_file_loads_and_round_trips(path: Path) -> None:
    cfg = load_config(path)
    assert Config.model_validate(tomllib.loads(to_toml(cfg))) == cfg


@pytest.mark.parametrize(
    "override, match",
    [
        ("learner.lrr=1", r"learner\.lrr: unknown key"),
        ("lerner.lr=1", r"lerner: unknown key"),
        ("learner.lr=-1", r"learner\.lr: Input should be greater than 0"),
        ("run.mode=fast", r"run\.mode: Input should be 'async' or 'sync'"),
        ("schedule.turn_limits=[[5, 3]]", r"schedule\.turn_limits: .*must start at step 0"),
        ("schedule.turn_limits=[[0, 3], [0, 4]]", r"strictly increasing"),
        ("learner.bind=tcp://0.0.0.0:*", r"fixed port"),
        ("nonsense", r"is not KEY=VALUE"),
        ('learner.baseline="step"', r"learner\.baseline: Input should be 'episode' or 'turn'"),
    ],
)
def test_bad_keys_and_values_are_named(override: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_config(None, [override])


def test_the_baseline_per_turn_is_the_default_and_a_saved_config_of_any_algorithm_loads_again(tmp_path: Path) -> None:
    from agentgym.config import to_toml

    for algo in ("grpo", "rloo", "ppo", "reinforce_pp"):
        cfg = load_config(None, [f'learner.algorithm="{algo}"'])
        assert cfg.learner.baseline == "turn"  # ppo and reinforce_pp ignore it
        saved = tmp_path / f"{algo}.toml"  # what a run directory keeps, and --resume reads
        saved.write_text(to_toml(cfg))
        assert load_config(saved, []).learner == cfg.learner


def test_file_errors_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[learner]\nlr = 0.1\nbatch_grups = 4\n")
    with pytest.raises(ConfigError, match=rf"invalid config \({bad}\): learner\.batch_grups: unknown key"):
        load_config(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.toml")
    (tmp_path / "broken.toml").write_text("[learner\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(tmp_path / "broken.toml")


def test_overrides_win_over_the_file_and_parse_toml_values() -> None:
    cfg = load_config(CONFIGS[0], ["learner.lr=0.5", "run.name=x", "schedule.turn_limits=[[0, 2], [10, 4]]"])
    assert cfg.learner.lr == 0.5 and cfg.run.name == "x"
    assert [cfg.schedule.turn_limit(s) for s in (0, 9, 10, 500)] == [2, 2, 4, 4]


def test_cli_help_is_instant_and_explains_every_flag() -> None:
    import subprocess
    import sys

    for args in (["agentgym.learner.main"], ["agentgym.actors.main"], ["agentgym.cli", "train"]):
        out = subprocess.run([sys.executable, "-m", *args, "--help"], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        assert "--config" in out.stdout and "-o KEY=VALUE" in out.stdout
    # --help is instant: the entry points import neither torch nor vLLM before parsing
    check = (
        "import sys, agentgym.learner.main, agentgym.actors.main; print('torch' in sys.modules, 'vllm' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=30)
    assert out.stdout.split() == ["False", "False"]
