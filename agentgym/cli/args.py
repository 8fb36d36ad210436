"""Command-line plumbing shared by the entry points: config flags, overrides, errors.

Each role's ``main()`` stays thin: parse, load the config, set up logging, run. Nothing heavy
(torch, vLLM) is imported here, so ``--help`` answers at once.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from agentgym.config import Config, ConfigError, load_config


def add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        type=Path,
        default=None,
        help="TOML config file (see configs/); defaults are used for what it leaves out",
    )
    p.add_argument(
        "-o",
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="dotted override in TOML syntax, repeatable, e.g. -o learner.lr=3e-4 -o run.mode=sync",
    )
    p.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="console log level (the JSON log in the run directory gets everything)",
    )


def resolve_config(args: argparse.Namespace, flag_overrides: list[str]) -> Config:
    """Config from --config, then -o overrides, then the role's own flags (which win)."""
    try:
        return load_config(args.config, [*args.override, *flag_overrides])
    except ConfigError as exc:
        sys.stderr.write(f"error: {exc}\n")
        raise SystemExit(2) from None


def fail(message: str, code: int = 2) -> SystemExit:
    """Print ``error: MESSAGE`` (one line) and return the SystemExit to raise: a user's mistake
    ends the command without a traceback."""
    sys.stderr.write(f"error: {message}\n")
    return SystemExit(code)


def preflight(cfg: Config, model_key: str = "model.path", env_options: bool = False) -> Config:
    """What a run needs from this host, checked before any engine, model or socket starts: every
    env name is known (envpool/registry.py; naming one imports nothing), every metrics sink's
    library is installed (agentgym/observe/sinks.py), and the model is found
    (agentgym/config/model_path.py, named ``model_key`` in the error). With ``env_options`` (envs
    are played on this host: ``agentgym train`` with local actors) each env goes through
    ``registry.check_env``, the one check of a config's env (its class's ``check_options``), and an
    env played by an agent program (``Env.agent_program``) needs the actor's agent endpoint set
    to it. Returns ``cfg`` with ``model.path`` resolved; exits with one line on a problem."""

    from agentgym.config.model_path import ModelNotFound, with_model_found
    from agentgym.envpool.registry import UnknownEnvError, check_env, env_target
    from agentgym.observe.sinks import SinkError, check_sinks

    try:
        for i, spec in enumerate(cfg.env.specs):
            where = f"env.mix[{i}]" if cfg.env.mix else "env"
            if not env_options:
                env_target(spec.name, f"{where}.name")
                continue
            program = check_env(spec.name, spec.kwargs, where).agent_program
            agent = cfg.actor.agent_endpoint
            if program and not (
                agent.enabled and agent.program == program and (not agent.envs or spec.name in agent.envs)
            ):
                raise ValueError(
                    f"{where}.name: env {spec.name} is played by its agent program through the agent "
                    f"endpoint: set actor.agent_endpoint.enabled = true and program = {program!r}"
                )
        check_sinks(cfg.metrics.sinks)
        return with_model_found(cfg, model_key)
    except (UnknownEnvError, SinkError, ModelNotFound, ImportError, ValueError, TypeError) as exc:
        raise fail(str(exc)) from None
