"""The registry of algorithms (agentgym/config/registries.py): the config's choices are its
names and every registered target loads."""

from __future__ import annotations

import typing

import pytest

from agentgym.config import Config, LearnerConfig
from agentgym.config.registries import ALGORITHMS, AlgorithmEntry, Registry


def test_the_config_accepts_exactly_the_registered_names() -> None:
    assert typing.get_args(LearnerConfig.model_fields["algorithm"].annotation) == ALGORITHMS.names()
    assert ALGORITHMS.names() == ("grpo", "ppo", "reinforce_pp", "rloo")
    with pytest.raises(ValueError, match=r"Input should be 'grpo', 'ppo', 'reinforce_pp' or 'rloo'"):
        Config(learner={"algorithm": "a2c"})


def test_traits_choose_the_rules_and_every_target_loads() -> None:
    assert ALGORITHMS.with_("group_relative") == ("grpo", "rloo")
    assert ALGORITHMS.with_("step_term") == ("grpo", "reinforce_pp", "rloo")
    assert ALGORITHMS.with_("critic") == ("ppo",)
    for name in ALGORITHMS.names():
        assert callable(ALGORITHMS.load(name)), name
    with pytest.raises(ValueError, match=r"learner.filter_groups needs learner.algorithm in \('grpo', 'rloo'\)"):
        Config(learner={"algorithm": "reinforce_pp", "filter_groups": "equal"})


def test_a_registry_names_the_known_entries_and_refuses_a_second_registration() -> None:
    reg: Registry[AlgorithmEntry] = Registry("learner.algorithm")
    reg.register(AlgorithmEntry("mine", "agentgym.learner.algorithms:grpo", group_relative=True))
    with pytest.raises(ValueError, match=r"learner.algorithm: 'mine' is registered twice"):
        reg.register(AlgorithmEntry("mine", "x:y"))
    with pytest.raises(ValueError, match=r"learner.algorithm: unknown 'other' \(known: mine\)"):
        reg.get("other")

