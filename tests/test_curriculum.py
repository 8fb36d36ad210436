"""The turn-limit curriculum (learner/control/curriculum.py, ``[schedule]``): per-env stages by step,
stages advanced by training success (threshold, plateau), the config's checks, and resume: the
state goes through a real learner checkpoint (Trainer.save / load_checkpoint, Learner.restore) and
the resumed curriculum advances exactly as the uninterrupted one, never twice, never reset."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from learner_fixtures import bandit_rollouts, make_cfg

from agentgym.config import Config, ConfigError, load_config, to_toml
from agentgym.learner.control.curriculum import Advance, Curriculum, success_counts
from agentgym.learner.control.evaluation import env_stats
from agentgym.learner.service import Learner
from agentgym.models.tiny import FALLBACK_CORPUS, make_tiny_model

MIX = ['env.mix=[{name = "guess_number"}, {name = "maze"}]']


def schedule(*overrides: str) -> Config:
    return load_config(None, [*MIX, *overrides])


def test_each_env_of_a_mix_has_its_own_step_stages_and_the_rest_follow_the_default() -> None:
    cfg = schedule("schedule.turn_limits=[[0, 4], [5, 6]]", "schedule.envs.maze.turn_limits=[[0, 6], [2, 13], [4, 20]]")
    cur = Curriculum(cfg.schedule, ["guess_number", "maze"])
    assert cur.limits() == {"guess_number": 4, "maze": 6}
    seen = {s: cur.observe(s, {}) for s in range(1, 7)}
    assert seen[2] == [Advance("maze", 6, 13, 2, "step")]
    assert seen[4] == [Advance("maze", 13, 20, 4, "step")]
    assert seen[5] == [Advance("guess_number", 4, 6, 5, "step")]
    assert seen[1] == seen[3] == seen[6] == []
    assert cur.limits() == {"guess_number": 6, "maze": 20}
    with pytest.raises(ValueError, match="step 8 observed after step 6"):
        cur.observe(8, {})


def test_threshold_advances_once_the_window_is_full_and_each_stage_starts_a_new_window() -> None:
    cfg = schedule(
        "schedule.envs.maze.stages=[6, 13, 20]", "schedule.envs.maze.threshold=0.5", "schedule.envs.maze.window=3"
    )
    cur = Curriculum(cfg.schedule, ["guess_number", "maze"])
    # (successes, episodes) of maze per step; a step without maze episodes does not count.
    steps = [(8, 8), (0, 8), None, (4, 8), (0, 8), (8, 8), (8, 8), (8, 8), (8, 8), (8, 8), (8, 8)]
    got = {}
    for s, c in enumerate(steps, 1):
        counts = {"guess_number": (1, 4)} | ({"maze": c} if c else {})
        got[s] = cur.observe(s, counts)
    # window full at step 4 (steps 1, 2, 4): 12/24 = 0.5 -> stage 2 (a lucky first step alone is not enough)
    assert [a for a in got.values() if a] == [
        [Advance("maze", 6, 13, 4, "threshold", 0.5)],
        # the new stage's window: steps 5, 6, 7 -> 16/24
        [Advance("maze", 13, 20, 7, "threshold", 0.6667)],
    ]
    assert cur.limits() == {"guess_number": 6, "maze": 20}  # the last stage stays
    m = cur.metrics({"guess_number": 6, "maze": 20})
    assert m == {
        "turn_limit": 20,
        "env/guess_number/turn_limit": 6,
        "env/maze/turn_limit": 20,
        "env/maze/turn_stage": 2,
        "env/maze/stage_success": 1.0,
    }


def test_plateau_advances_after_patience_steps_without_a_min_delta_rise() -> None:
    cfg = schedule("schedule.stages=[2, 4]", "schedule.patience=3", "schedule.min_delta=0.1", "schedule.window=1")
    cur = Curriculum(cfg.schedule, ["guess_number", "maze"])
    rates = [0.1, 0.3, 0.35, 0.39, 0.38, 0.3, 0.2]  # best 0.3 at step 2; +0.05, +0.09, +0.08 do not count
    fired = [cur.observe(s, {"guess_number": (round(r * 100), 100)}) for s, r in enumerate(rates, 1)]
    assert fired[:4] == [[], [], [], []]
    assert fired[4] == [Advance("guess_number", 2, 4, 5, "plateau", 0.38)]
    assert cur.limits() == {"guess_number": 4, "maze": 2}  # maze (no episodes) waits in its own stage 0
    assert fired[5:] == [[], []]


def test_threshold_or_plateau_whichever_comes_first() -> None:
    cfg = schedule("schedule.stages=[2, 4, 8]", "schedule.threshold=0.9", "schedule.patience=2", "schedule.window=2")
    cur = Curriculum(cfg.schedule, ["guess_number", "maze"])
    out = [cur.observe(s, {"maze": c}) for s, c in enumerate([(1, 2), (1, 2), (1, 2), (1, 2), (2, 2), (2, 2)], 1)]
    assert [a for x in out for a in x] == [
        Advance("maze", 2, 4, 4, "plateau", 0.5),  # full at step 2 (best 0.5), no rise at 3 and 4
        Advance("maze", 4, 8, 6, "threshold", 1.0),  # new window: steps 5 and 6
    ]


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["schedule.stages=[6, 13]"], r"schedule: .*never advance: set threshold and/or patience"),
        (["schedule.threshold=0.5"], r"set stages"),
        (["schedule.stages=[6, 13]", "schedule.threshold=0.5", "schedule.turn_limits=[[0, 2]]"], r"not both"),
        (
            ["schedule.envs.maze.stages=[1, 2]", "schedule.envs.maze.threshold=1.5"],
            r"schedule\.envs\.maze\.threshold: .*less than or equal to 1",
        ),
        (
            ["schedule.envs.babyai.turn_limits=[[0, 2]]"],
            r"schedule\.envs: \['babyai'\] not among the run's environments",
        ),
        (
            ["schedule.envs.maze.stages=[0, 2]", "schedule.envs.maze.patience=2"],
            r"schedule\.envs\.maze\.stages\.0: .*greater than or equal to 1",
        ),
        (["schedule.envs.maze.windw=3"], r"schedule\.envs\.maze\.windw: unknown key"),
        (["schedule.window=0"], r"schedule\.window: .*greater than or equal to 1"),
    ],
)
def test_bad_schedules_are_named(overrides: list[str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        schedule(*overrides)


def test_a_single_schedule_still_works_and_per_env_schedules_round_trip() -> None:
    plain = load_config(None, ["schedule.turn_limits=[[0, 2], [10, 4]]"])
    assert [plain.schedule.turn_limit(s) for s in (0, 9, 10)] == [2, 2, 4] and plain.schedule.final_limit == 4
    cfg = schedule(
        "schedule.envs.maze.stages=[3, 5]",
        "schedule.envs.maze.patience=4",
        "schedule.envs.guess_number.turn_limits=[[0, 1], [7, 2]]",
    )
    assert Config.model_validate(tomllib.loads(to_toml(cfg))) == cfg
    assert cfg.schedule.for_env("maze").final_limit == 5 and cfg.schedule.for_env("guess_number").final_limit == 2
    with pytest.raises(ValueError, match="advances by training success"):
        cfg.schedule.for_env("maze").turn_limit(3)


def test_success_counts_come_from_the_batch_stats() -> None:
    stats = {
        "env/maze/episodes": 8.0,
        "env/maze/success_rate": 0.375,
        "env/guess_number/episodes": 3.0,
        "env/guess_number/success_rate": 1 / 3,
        "env/maze/turns_mean": 2.0,
    }
    assert success_counts(stats) == {"maze": (3, 8), "guess_number": (1, 3)}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("curriculum") / "m", corpus=FALLBACK_CORPUS, seed=0)


def test_a_resume_from_a_learner_checkpoint_neither_repeats_nor_resets_a_stage(
    tiny_model: Path, tmp_path: Path
) -> None:
    from agentgym.learner.training.trainer import Trainer

    overrides = (
        "learner.batch_groups=2",
        "schedule.stages=[2, 3, 4, 5]",
        "schedule.threshold=0.6",
        "schedule.patience=2",
        "schedule.window=2",
        "schedule.envs.maze.turn_limits=[[0, 2], [3, 7]]",
        *MIX,
    )
    cfg = make_cfg(tiny_model, *overrides)
    script = [{"guess_number": (s, 4)} for s in (1, 2, 4, 1, 1, 1, 1, 2, 2, 3)]  # 10 steps of success counts

    straight = Curriculum(cfg.schedule, ["guess_number", "maze"])
    expected = [straight.observe(s, c) for s, c in enumerate(script, 1)]
    assert [(a.env, a.to_limit, a.step, a.reason) for x in expected for a in x] == [
        ("guess_number", 3, 3, "threshold"),
        ("maze", 7, 3, "step"),
        ("guess_number", 4, 7, "plateau"),
        ("guess_number", 5, 10, "threshold"),
    ]

    trainer = Trainer.load(cfg)
    try:
        learner = Learner(cfg, tmp_path, trainer=trainer, hub=None)
        for s in range(1, 6):  # real steps: the checkpoint's step is the trainer's
            trainer.train_step(bandit_rollouts(group_size=cfg.rollout.group_size))
            assert learner.curriculum.observe(trainer.step, script[s - 1]) == expected[s - 1]
        trainer.save(tmp_path / "ckpt", learner.checkpoint_state())
    finally:
        trainer.close()
    saved = json.loads((tmp_path / "ckpt" / "trainer" / "extra_state.json").read_text())["curriculum"]
    # after step 5 the env sits in stage 1 (limit 3) with the steps 4 and 5 in its window
    assert saved["step"] == 5 and saved["envs"]["guess_number"]["stage"] == 1
    assert saved["envs"]["guess_number"]["window"] == [[1, 4], [1, 4]]

    resumed_trainer = Trainer.load(cfg)
    try:
        extra = resumed_trainer.load_checkpoint(tmp_path / "ckpt")
        resumed = Learner(cfg, tmp_path, trainer=resumed_trainer, hub=None)
        resumed.restore(extra)
    finally:
        resumed_trainer.close()
    cur = resumed.curriculum
    assert cur.limits() == {"guess_number": 3, "maze": 7}  # neither reset to stage 0 nor advanced again
    assert [cur.observe(s, script[s - 1]) for s in range(6, 11)] == expected[5:]
    assert cur.state() == straight.state()

    # A state that does not fit the checkpoint or the config is refused, not silently reset.
    with pytest.raises(ValueError, match="curriculum state is of step 5, the checkpoint of step 6"):
        Curriculum(cfg.schedule, ["guess_number", "maze"]).restore(saved, 6)
    other = make_cfg(tiny_model, *overrides, "schedule.stages=[2, 9]")
    with pytest.raises(ValueError, match=r"the checkpoint's stages are \[2, 3, 4, 5\], the config's \[2, 9\]"):
        Curriculum(other.schedule, ["guess_number", "maze"]).restore(saved, 5)
    # a checkpoint written before the curriculum existed: success-driven envs start at stage 0
    old = Curriculum(cfg.schedule, ["guess_number", "maze"])
    assert old.restore(None, 5) == ["guess_number"] and old.limits() == {"guess_number": 2, "maze": 7}


def test_the_learner_reports_the_limits_a_batch_was_played_under(tiny_model: Path, tmp_path: Path) -> None:
    cfg = make_cfg(tiny_model, *MIX, "schedule.envs.maze.turn_limits=[[0, 2], [1, 5]]", "schedule.turn_limits=[[0, 3]]")
    ln = Learner(cfg, tmp_path, trainer=None, hub=None)
    batch = bandit_rollouts(group_size=2)
    played = ln.curriculum.limits()
    assert ln.curriculum.observe(1, success_counts(env_stats(batch))) == [Advance("maze", 2, 5, 1, "step")]
    assert ln.curriculum.metrics(played) == {
        "turn_limit": 3,
        "env/guess_number/turn_limit": 3,
        "env/maze/turn_limit": 2,
    }
    assert ln.curriculum.limits() == {"guess_number": 3, "maze": 5}
