"""The registries of algorithms and engines (agentgym/config/registries.py): the config's choices
are their names, every registered target loads, and both of the actor's engine users build
through the one factory."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest

from agentgym.config import ActorConfig, Config, LearnerConfig
from agentgym.config.registries import ALGORITHMS, ENGINES, AlgorithmEntry, Registry


def test_the_config_accepts_exactly_the_registered_names() -> None:
    assert typing.get_args(LearnerConfig.model_fields["algorithm"].annotation) == ALGORITHMS.names()
    assert typing.get_args(ActorConfig.model_fields["engine"].annotation) == ENGINES.names()
    assert ALGORITHMS.names() == ("grpo", "ppo", "reinforce_pp", "rloo")
    assert ENGINES.names() == ("vllm", "remote", "hf", "sim")
    with pytest.raises(ValueError, match=r"Input should be 'grpo', 'ppo', 'reinforce_pp' or 'rloo'"):
        Config(learner={"algorithm": "a2c"})
    with pytest.raises(ValueError, match=r"Input should be 'vllm', 'remote', 'hf' or 'sim'"):
        Config(actor={"engine": "tgi"})


def test_traits_choose_the_rules_and_every_target_loads() -> None:
    assert ALGORITHMS.with_("group_relative") == ("grpo", "rloo")
    assert ALGORITHMS.with_("step_term") == ("grpo", "reinforce_pp", "rloo")
    assert ALGORITHMS.with_("critic") == ("ppo",)
    assert ENGINES.with_("lora") == ("vllm", "hf")
    for reg in (ALGORITHMS, ENGINES):
        for name in reg.names():
            assert callable(reg.load(name)), name
    with pytest.raises(ValueError, match=r"learner.filter_groups needs learner.algorithm in \('grpo', 'rloo'\)"):
        Config(learner={"algorithm": "reinforce_pp", "filter_groups": "equal"})


def test_a_registry_names_the_known_entries_and_refuses_a_second_registration() -> None:
    reg: Registry[AlgorithmEntry] = Registry("learner.algorithm")
    reg.register(AlgorithmEntry("mine", "agentgym.learner.algorithms.estimators:grpo", group_relative=True))
    with pytest.raises(ValueError, match=r"learner.algorithm: 'mine' is registered twice"):
        reg.register(AlgorithmEntry("mine", "x:y"))
    with pytest.raises(ValueError, match=r"learner.algorithm: unknown 'other' \(known: mine\)"):
        reg.get("other")


def test_the_policy_and_a_critic_build_engines_through_one_factory(tmp_path: Path) -> None:
    from agentgym.actors.engines.builders import EngineRequest, build_engine, make_engine
    from agentgym.actors.engines.hf_engine import HfEngine
    from agentgym.actors.engines.remote_engine import RemoteEngine
    from agentgym.protocol.messages import LoraSpec

    (tmp_path / "config.json").write_text('{"max_position_embeddings": 64, "vocab_size": 32}')
    critic = build_engine("hf", EngineRequest(tmp_path, seed=3))  # a critic's: the engine's defaults
    assert isinstance(critic, HfEngine) and critic.device == "cpu"
    remote = build_engine("remote", EngineRequest(None, url="http://h:1", model="m"))
    assert isinstance(remote, RemoteEngine) and remote.url == "http://h:1"
    policy = make_engine(Config(actor={"engine": "hf"}), tmp_path)  # the actor's: its [actor] settings
    assert isinstance(policy, HfEngine) and policy.device == "auto"
    with pytest.raises(ValueError, match="cannot serve the learner's LoRA adapters .* use the vllm or hf engine"):
        make_engine(
            Config(actor={"engine": "sim"}), tmp_path, lora=LoraSpec(rank=4, alpha=8.0, target_modules=["q_proj"])
        )
