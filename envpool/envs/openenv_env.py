"""``openenv``: an OpenEnv environment (``openenv-core`` 0.3.0), its ``Environment`` class played
in the env worker's own process: no HTTP server, no container. Needs the ``openenv`` extra.

    options:  env: str                     "module:Class", an ``openenv.core.env_server.Environment``
                                           subclass (the class an OpenEnv server wraps)
              any other option             an argument of its constructor (``high = 8``)
              action: str = ""             "module:Class" of its ``Action`` model; default: the
                                           annotation of its ``step``'s ``action`` parameter
              action_field: str = ""       the ``Action`` field the agent's reply fills; default:
                                           the model's one required field. An ``Action`` with
                                           several required fields takes the reply as a JSON object
              observation_field: str = ""  the ``Observation`` field shown to the agent; default:
                                           its one field besides done/reward/metadata, else every
                                           such field as "name: value" lines
              instructions: str = ""       the task text shown before the first observation
              python_path: list = []       directories put on ``sys.path`` before ``env`` is imported
    task ids: procedural: ``reset(seed=task_id)`` when the env's ``reset`` takes a seed (else the
              env decides, and an episode is not a function of its task id).
    reset ->  the observation's text.
    step  ->  the reply as the ``Action`` (pydantic-validated: a reply that does not validate is an
              invalid move, feedback and reward 0, the turn counts), then the env's ``step``: the
              observation's text, its ``reward`` (None is 0) and ``done``. Success: done with a
              reward of 1 or more.

OpenEnv envs are usually served over HTTP from a Docker image (``openenv serve``, Hugging Face
Spaces), and an env that exists only as an image or a Space cannot be played here: the adapter
needs the env's Python package installed on the actor's host. The ``Environment`` class it then
imports is what the image would run, called directly (``reset``/``step``), one per env worker.
"""

from __future__ import annotations

import importlib
import inspect
import json
import sys
import typing
from pathlib import Path
from typing import Any

from agentgym.envpool.base import Env, StepResult
from agentgym.envpool.envs.ecosystem import one_line, require

NAME = "openenv"
EXTRA = "openenv"
_BASE_OBS = {"done", "reward", "metadata"}


def _load(target: object, key: str) -> Any:
    if not isinstance(target, str) or ":" not in target:
        raise ValueError(f"env {NAME}: option {key} must be 'module:Class', got {target!r}")
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ImportError(f"env {NAME}: option {key}: cannot import {module_name!r}: {one_line(exc)}") from None
    found = getattr(module, attr, None)
    if found is None:
        # what the module does hold of the kind asked for: its Environment or Action classes
        base = getattr(require("openenv.core.env_server", EXTRA, NAME), "Action" if key == "action" else "Environment")
        have = sorted(
            n for n, v in vars(module).items() if isinstance(v, type) and issubclass(v, base) and v is not base
        )
        listed = f"; its {base.__name__} classes: {', '.join(have)}" if have else f"; it has no {base.__name__} class"
        raise ValueError(f"env {NAME}: option {key}: {module_name} has no {attr!r}{listed}")
    return found


class OpenEnv(Env):
    name = NAME
    preload = ("openenv.core.env_server",)  # imported once by the pool's zygote (seconds: fastapi, pydantic)

    def __init__(
        self,
        env: str = "",
        action: str = "",
        action_field: str = "",
        observation_field: str = "",
        instructions: str = "",
        python_path: list[str] | None = None,
        **env_kwargs: object,
    ) -> None:
        super().__init__()
        server = require("openenv.core.env_server", EXTRA, NAME)
        for path in reversed(list(python_path or [])):
            path = str(Path(path).resolve())
            if path not in sys.path:
                sys.path.insert(0, path)
        if not env:
            raise ValueError(f"env {NAME}: option env ('module:Class', an OpenEnv Environment subclass) is required")
        cls = _load(env, "env")
        if not (isinstance(cls, type) and issubclass(cls, server.Environment)):
            raise ValueError(f"env {NAME}: option env: {env} is {cls!r}, not an OpenEnv Environment subclass")
        # a pydantic model class of the env's package, known only at run time
        action_cls = _load(action, "action") if action else self._step_annotation(cls, env)
        if not (isinstance(action_cls, type) and issubclass(action_cls, server.Action)):
            raise ValueError(f"env {NAME}: option action: {action_cls!r} is not an OpenEnv Action model")
        self.action_cls: Any = typing.cast(Any, action_cls)  # a type narrowed above would hide its pydantic fields
        required = [n for n, f in self.action_cls.model_fields.items() if f.is_required()]
        if action_field and action_field not in self.action_cls.model_fields:
            raise ValueError(
                f"env {NAME}: option action_field: {self.action_cls.__name__} has no field {action_field!r}; "
                f"its fields: {sorted(self.action_cls.model_fields)}"
            )
        self.action_field = action_field or (required[0] if len(required) == 1 else "")
        self.observation_field = observation_field
        self._instructions = instructions
        try:
            self.env = cls(**env_kwargs)
        except Exception as exc:  # noqa: BLE001 - whatever the constructor raised, as one line naming the class
            raise ValueError(
                f"env {NAME}: {env}({', '.join(sorted(env_kwargs))}) failed: {type(exc).__name__}: {one_line(exc)}"
            ) from None
        params = inspect.signature(self.env.reset).parameters
        self._seeded = "seed" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())
        self._done = True
        self._turns = 0

    @staticmethod
    def _step_annotation(cls: type, env: str) -> Any:
        try:
            hints = typing.get_type_hints(cls.step)  # type: ignore[attr-defined]  # an Environment subclass, checked by the caller
        except Exception:  # noqa: BLE001 - an annotation that does not resolve: ask for the option
            hints = {}
        found = hints.get("action")
        if not isinstance(found, type):
            raise ValueError(
                f"env {NAME}: {env}.step does not annotate its action with an Action class: set the option action"
            )
        return found

    @classmethod
    def check_options(cls, **options: object) -> None:
        cls(**options).close()  # type: ignore[arg-type]  # the constructor checks the values; imports the env and builds it: a wrong class or field is named at start-up

    def instructions(self) -> str:
        return self._instructions

    def _text(self, obs: Any) -> str:
        if self.observation_field:
            return str(getattr(obs, self.observation_field))
        fields = {k: v for k, v in obs.model_dump().items() if k not in _BASE_OBS}
        if len(fields) == 1:
            return str(next(iter(fields.values())))
        return "\n".join(f"{k}: {v if isinstance(v, str) else json.dumps(v, default=str)}" for k, v in fields.items())

    def reset(self, task_id: int) -> str:
        obs = self.env.reset(seed=task_id) if self._seeded else self.env.reset()
        self._done, self._turns = bool(obs.done), 0
        return self._text(obs)

    def _action(self, text: str) -> Any:
        if self.action_field:
            return self.action_cls(**{self.action_field: text.strip()})
        return self.action_cls(**json.loads(text))

    def step(self, action: str) -> StepResult:
        if self._done:
            return StepResult("The episode is over.", 0.0, True, {"turns": self._turns, "success": False})
        self._turns += 1
        try:
            act = self._action(action)
        except (ValueError, TypeError) as exc:  # pydantic's ValidationError is a ValueError; so is bad JSON
            want = (
                f"its {self.action_field!r}"
                if self.action_field
                else f"a JSON object of {sorted(self.action_cls.model_fields)}"
            )
            text = f"Invalid action {action[:60]!r} for {self.action_cls.__name__} ({want}): {one_line(exc, 200)}"
            return StepResult(text, 0.0, False, {"turns": self._turns, "valid": False})
        obs = self.env.step(act)
        reward, self._done = float(obs.reward or 0.0), bool(obs.done)
        info: dict[str, Any] = {"turns": self._turns}
        if self._done:
            info["success"] = reward >= 1.0
        return StepResult(self._text(obs), reward, self._done, info)

    def expert_action(self) -> str:
        raise NotImplementedError(f"env {NAME}: OpenEnv environments have no scripted expert")

    def close(self) -> None:
        close = getattr(getattr(self, "env", None), "close", None)
        if callable(close):
            close()
