"""The registries of the learner's algorithms and the actor's engines: every name the config
accepts for ``learner.algorithm`` and ``actor.engine``, what each one is, and where its code is.

    ALGORITHMS.names()                  # ("grpo", "ppo", "reinforce_pp", "rloo"): the config's choices
    ALGORITHMS.get("rloo").group_relative
    estimate = ALGORITHMS.load("rloo")  # agentgym.learner.algorithms.estimators.rloo, imported now
    build = ENGINES.load("hf")          # agentgym.actors.engines.builders.build_hf

A new algorithm or engine is one module (its estimator or engine builder) and one ``register``
line below. The config builds its ``Literal`` from the names here, so validation, the error that
lists the known names, ``agentgym config --explain`` and the JSON schema all follow this list.
An entry names its code by import path ("module:attribute", as vLLM's model registry does) and
loads it only when asked: the config stays free of torch and vLLM, and never imports a role
(the import contracts in pyproject.toml; docs/adr/0024-registries.md).
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

E = TypeVar("E")


@dataclass(frozen=True)
class AlgorithmEntry:
    """An advantage estimator (learner/algorithms/estimators.py calls ``target`` with the batch's rewards)."""

    name: str
    target: str
    group_relative: bool = False
    """Advantages relative to the group's other episodes (grpo, rloo): an all-equal group has
    none (learner.filter_groups), and a stale group's baseline can be recentred under pi_prox
    (learner.importance_baseline)."""
    step_term: bool = False
    """Takes the step-relative term (learner.step_advantage_weight): the estimators without a
    baseline of each state. A critic is that baseline already."""
    critic: bool = False
    """Learns a value model (learner.value_model) and needs its values and bootstrap."""


@dataclass(frozen=True)
class EngineEntry:
    """An inference engine (actors/engines/builders.py calls ``target`` to build it)."""

    name: str
    target: str
    lora: bool = False
    """Serves the learner's LoRA adapters (learner.lora)."""


@dataclass
class Registry(Generic[E]):
    """Entries by name, in registration order; ``field`` is the config key that chooses one."""

    field: str
    entries: dict[str, E] = dataclasses.field(default_factory=dict)  # `field` is the attribute above

    def register(self, entry: E) -> E:
        name = entry.name  # type: ignore[attr-defined]  # every entry type has a name
        if name in self.entries:
            raise ValueError(f"{self.field}: {name!r} is registered twice")
        self.entries[name] = entry
        return entry

    def names(self) -> tuple[str, ...]:
        return tuple(self.entries)

    def with_(self, trait: str) -> tuple[str, ...]:
        """The names whose entry has ``trait`` set, e.g. ``ALGORITHMS.with_("step_term")``."""
        return tuple(n for n, e in self.entries.items() if getattr(e, trait))

    def get(self, name: str) -> E:
        try:
            return self.entries[name]
        except KeyError:
            raise ValueError(f"{self.field}: unknown {name!r} (known: {', '.join(self.entries)})") from None

    def load(self, name: str) -> Any:
        """The entry's code: its module imported now, the attribute returned."""
        module, _, attr = self.get(name).target.partition(":")  # type: ignore[attr-defined]  # every entry type has a target
        return getattr(importlib.import_module(module), attr)


ALGORITHMS: Registry[AlgorithmEntry] = Registry("learner.algorithm")
ALGORITHMS.register(
    AlgorithmEntry("grpo", "agentgym.learner.algorithms.estimators:grpo", group_relative=True, step_term=True)
)
ALGORITHMS.register(AlgorithmEntry("ppo", "agentgym.learner.algorithms.estimators:ppo", critic=True))
ALGORITHMS.register(
    AlgorithmEntry("reinforce_pp", "agentgym.learner.algorithms.estimators:reinforce_pp", step_term=True)
)
ALGORITHMS.register(
    AlgorithmEntry("rloo", "agentgym.learner.algorithms.estimators:rloo", group_relative=True, step_term=True)
)

ENGINES: Registry[EngineEntry] = Registry("actor.engine")
ENGINES.register(EngineEntry("vllm", "agentgym.actors.engines.builders:build_vllm", lora=True))
ENGINES.register(EngineEntry("remote", "agentgym.actors.engines.builders:build_remote"))
ENGINES.register(EngineEntry("hf", "agentgym.actors.engines.builders:build_hf", lora=True))
ENGINES.register(EngineEntry("sim", "agentgym.actors.engines.builders:build_sim"))
