"""The one typed configuration tree of a run, loaded from TOML with dotted CLI overrides.

    cfg = load_config(Path("configs/quickstart.toml"), overrides=["learner.lr=3e-4"])

Every section forbids unknown keys, so a typo fails at start-up with the key's full path. Fields
carry bounds and a docstring (shown by ``agentgym config --explain``). Validators check; they do
not rewrite. The resolved config is written to the run directory as ``config.toml``.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import tomllib
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError, model_validator

# Every section is imported from here (the sections live in three modules to keep each under 400 lines).
from agentgym.config.actor import ActorConfig, AgentEndpointConfig, RemoteEngineConfig, SimEngineConfig  # noqa: F401
from agentgym.config.learner import LearnerConfig, LoraConfig  # noqa: F401
from agentgym.config.sections import (  # noqa: F401
    CriticConfig,
    EnvConfig,
    EnvSpec,
    EvalConfig,
    LaunchConfig,
    MetricsConfig,
    ModelConfig,
    RolloutConfig,
    RunConfig,
    ScheduleConfig,
    Section,
    TurnSchedule,
)


class Config(Section):
    run: RunConfig = RunConfig()
    model: ModelConfig = ModelConfig()
    env: EnvConfig = EnvConfig()
    rollout: RolloutConfig = RolloutConfig()
    learner: LearnerConfig = LearnerConfig()
    actor: ActorConfig = ActorConfig()
    schedule: ScheduleConfig = ScheduleConfig()
    eval: EvalConfig = EvalConfig()
    launch: LaunchConfig = LaunchConfig()
    metrics: MetricsConfig = MetricsConfig()
    critic: CriticConfig = CriticConfig()

    @model_validator(mode="after")
    def _schedule_envs(self) -> Config:
        names = [e.name for e in self.env.specs]
        unknown = sorted(set(self.schedule.envs) - set(names))
        if unknown:
            raise ValueError(f"schedule.envs: {unknown} not among the run's environments {names}")
        return self

    def to_toml(self, unset: bool = False) -> str:
        """This config as TOML (``to_toml`` below); the metric sinks record it through this method,
        so agentgym/observe needs no import of the config package."""
        return to_toml(self, unset)


class ConfigError(ValueError):
    """A config file or override is invalid; the message names the key and the source."""


def _parse_value(raw: str) -> Any:
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw  # a bare word: take it as a string


def apply_override(data: dict[str, Any], item: str) -> None:
    """Apply ``a.b.c=value`` (value in TOML syntax, bare words as strings) to nested dicts."""
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {item!r} is not KEY=VALUE (e.g. learner.lr=3e-4)")
    *parents, leaf = key.strip().split(".")
    node = data
    for p in parents:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {item!r}: {p!r} is a value, not a section")
    node[leaf] = _parse_value(raw.strip())


def _section_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The config section (a pydantic model) that holds the key at ``loc``, walking fields,
    list items and dict values (``env.mix[1]``, ``schedule.envs.maze``); None where it is not one."""
    node: Any = Config
    for part in loc[:-1]:
        if isinstance(node, type) and issubclass(node, BaseModel):
            field = node.model_fields.get(str(part))
            if field is None:
                return None
            node = field.annotation
        elif typing.get_origin(node) in (list, dict):  # an index or a dict key: step into the item type
            node = typing.get_args(node)[-1]
        else:
            return None
        while typing.get_origin(node) in (typing.Union, types.UnionType):  # X | None
            node = next((a for a in typing.get_args(node) if a is not type(None)), None)
    return node if isinstance(node, type) and issubclass(node, BaseModel) else None


def _unknown_key(loc: tuple[Any, ...]) -> str:
    """``unknown key``, with the closest known key of that section when one is close."""
    section = _section_at(loc)
    near = difflib.get_close_matches(str(loc[-1]), list(section.model_fields) if section else [], n=1)
    return f"unknown key (did you mean {near[0]}?)" if near else "unknown key"


def _format_errors(exc: ValidationError, source: str) -> str:
    """One line in all, every problem named: ``invalid config (F): 3 problems: A; B; C``. A
    terminal shows it whole, and a log or CI grep finds the config's error on one line."""
    problems = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        where = ".".join(str(p) for p in loc)
        if err["type"] == "extra_forbidden":
            problems.append(f"{where}: {_unknown_key(loc)}")
        elif err["type"] == "value_error":  # our validators' messages name the key and the value
            msg = err["msg"].removeprefix("Value error, ")
            problems.append(msg if msg.startswith(where) else f"{where}: {msg}")
        else:
            problems.append(f"{where}: {err['msg']} (got {err.get('input')!r})")
    problems = [" ".join(p.split()) for p in problems]  # a message never breaks the line
    if len(problems) == 1:
        return f"invalid config ({source}): {problems[0]}"
    return f"invalid config ({source}): {len(problems)} problems: " + "; ".join(problems)


def load_config(path: Path | None = None, overrides: Sequence[str] = ()) -> Config:
    """Load ``path`` (or the defaults), apply dotted overrides, validate the whole tree."""
    data: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        try:
            data = tomllib.loads(Path(path).read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
        source = str(path)
    for item in overrides:
        apply_override(data, item)
    if overrides:
        source += " + overrides " + " ".join(overrides)
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_errors(exc, source)) from None


def to_toml(cfg: Config, unset: bool = False) -> str:
    """The resolved config as TOML (written to the run directory). TOML has no null: a key whose
    value is unset (None) is left out, or with ``unset`` written as a comment (`agentgym config`)."""

    def unset_keys(fields: dict[str, Any], prefix: str = "") -> list[str]:
        out = []
        for k, v in fields.items():
            if v is None:
                out.append(prefix + k)
            elif isinstance(v, dict):
                out.extend(unset_keys(v, f"{prefix}{k}."))
        return out

    def value(v: Any) -> str:
        if isinstance(v, bool):
            return str(v).lower()
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{json.dumps(k)} = {value(x)}" for k, x in v.items() if x is not None) + " }"
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return json.dumps(v)  # strings (JSON escapes are TOML escapes), numbers

    out: list[str] = []
    for section, fields in cfg.model_dump(mode="json").items():
        if section == "env" and fields["mix"]:
            fields = {"mix": fields["mix"]}  # the single-env keys would contradict the mix
        out.append(f"[{section}]")
        out.extend(f"{k} = {value(v)}" for k, v in fields.items() if v is not None)
        if unset:
            out.extend(f"# {k} = (unset)" for k in unset_keys(fields))
        out.append("")
    return "\n".join(out)


def model_fingerprint(model_dir: Path) -> str:
    """Identity of a model directory's architecture and tokenizer (not its weights)."""
    h = hashlib.sha256()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        f = Path(model_dir) / name
        if f.exists():
            h.update(name.encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:16]
