"""``agentgym-actor``: plays episodes with an inference engine and streams them to a learner.

    agentgym-actor --learner tcp://LEARNER_HOST:5555 [--config configs/X.toml] [--model DIR]

The learner sends everything about how to play (environment, group size, sampling, turn limit);
the actor brings its engine, its environment pool and its capacity (--max-groups). With no
model directory of its own it uses the learner's path (a shared filesystem). Start and stop
actors at any time: the learner re-issues the work of one that leaves or dies.
Exit codes: 0 shut down by the learner or a signal, 2 rejected or misconfigured, 3 no learner.

This module parses and checks; the process itself is ``run_actor_process``
(actors/process.py). ``python -m agentgym.actors.main`` is this command too.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from agentgym.cli.args import add_config_args, fail, resolve_config


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="agentgym-actor", description=__doc__.split("\n\n")[0].split(": ", 1)[1])
    add_config_args(p)
    p.add_argument("--learner", help="learner control address tcp://HOST:PORT (overrides actor.learner)")
    p.add_argument(
        "--model",
        help="local HF model directory, or a hub id ORG/NAME in the local Hugging Face cache (overrides model.path)",
    )
    p.add_argument("--max-groups", type=int, help="groups played at once (overrides actor.max_groups)")
    p.add_argument("--run-dir", type=Path, help="where this actor writes its logs (default: run.dir/run.name)")
    p.add_argument("--actor-id", help="stable id for this actor (default: random); reuse it to resume after a restart")
    p.add_argument(
        "--secret-key",
        type=Path,
        help="CURVE key pair file of this actor, DIR/actors/NAME.key_secret "
        "(overrides actor.secret_key; see `agentgym keys`)",
    )
    p.add_argument(
        "--learner-key", type=Path, help="the learner's public key file, DIR/learner.key (overrides actor.learner_key)"
    )
    p.add_argument(
        "--weights-relay",
        help="fetch weights from this relay, tcp://HOST:PORT (agentgym-relay; "
        "overrides actor.weights_relay); the learner stays the fallback",
    )
    p.add_argument(
        "--connect-timeout", type=float, help="seconds to wait for the learner (overrides actor.connect_timeout_s)"
    )
    return p


def main(argv: list[str] | None = None) -> int:
    from agentgym.host import early_signals

    early_signals.hold()  # a SIGTERM while torch loads or the learner is awaited: a clean stop, with its record
    args = build_parser().parse_args(argv)
    flags = []
    if args.learner:
        flags.append(f'actor.learner="{args.learner}"')
    if args.model:
        flags.append(f'model.path="{args.model}"')
    if args.max_groups is not None:
        flags.append(f"actor.max_groups={args.max_groups}")
    if args.connect_timeout is not None:
        flags.append(f"actor.connect_timeout_s={args.connect_timeout}")
    flags += [
        f'actor.{k}="{v}"'
        for k, v in (
            ("secret_key", args.secret_key),
            ("learner_key", args.learner_key),
            ("weights_relay", args.weights_relay),
        )
        if v
    ]
    cfg = resolve_config(args, flags)
    from agentgym.config.model_path import ModelNotFound, with_model_found

    try:  # a local dir or a hub id in the local cache (agentgym/config/model_path.py), before any engine starts
        cfg = with_model_found(cfg, "--model" if args.model else "model.path")
    except ModelNotFound as exc:
        if args.model:  # named on the command line: it must be here
            raise fail(str(exc)) from None
        # model.path from a config shared with the learner: not on this host, so the actor plays
        # with the learner's model directory (a shared filesystem), checked at the handshake
    from agentgym.actors.process import run_actor_process

    return run_actor_process(cfg, args.run_dir or cfg.run.path, actor_id=args.actor_id, log_level=args.log_level)


if __name__ == "__main__":
    sys.exit(main())
