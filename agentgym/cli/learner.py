"""``agentgym-learner``: the central learner process.

    agentgym-learner --config configs/quickstart.toml --bind tcp://0.0.0.0:5555

It binds the control socket at --bind and the weight server at the next port, waits for actors
(``agentgym-actor --learner tcp://HOST:5555``), trains for run.max_steps optimizer steps and
writes logs, metrics.jsonl, the resolved config and checkpoints to the run directory.

    agentgym-learner --resume runs/quickstart -o run.max_steps=200     # continue a run

Learner ranks on several hosts (docs/adr/0012-lora-and-multinode-learner.md): start one
``agentgym-learner`` per rank with torchrun's environment (``torchrun --nnodes 2 --nproc-per-node 1
--rdzv-endpoint ... -m agentgym.learner.main --config ...`` or RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT
by hand); RANK 0 is the learner the actors talk to, RANK > 0 a data-parallel worker of it.

This module parses and checks; the process itself is ``run_learner_process``
(learner/process.py). ``python -m agentgym.learner.main`` is this command too.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from agentgym.cli.args import add_config_args, preflight, resolve_config


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="agentgym-learner",
        description="Train an LLM agent from trajectories streamed by agentgym-actor processes.",
    )
    add_config_args(p)
    p.add_argument(
        "--bind", help="control address tcp://HOST:PORT (weights are served on PORT+1); overrides learner.bind"
    )
    p.add_argument("--run-dir", type=Path, help="run directory (overrides run.dir/run.name)")
    p.add_argument("--max-steps", type=int, help="optimizer steps (overrides run.max_steps)")
    p.add_argument("--mode", choices=["async", "sync"], help="overrides run.mode")
    p.add_argument(
        "--model",
        help="HF model directory, or a hub id ORG/NAME in the local Hugging Face cache (overrides model.path)",
    )
    p.add_argument(
        "--resume",
        type=Path,
        metavar="RUN_DIR",
        help="continue the run in RUN_DIR from its newest checkpoint (weights, optimizer, "
        "step, version, dedupe state); its config.toml is used unless --config is given",
    )
    p.add_argument(
        "--secret-key",
        type=Path,
        help="CURVE key pair file of the learner, DIR/learner.key_secret "
        "(overrides learner.secret_key; see `agentgym keys`)",
    )
    p.add_argument(
        "--authorized-keys",
        type=Path,
        help="directory of admitted actors' public keys, DIR/authorized (overrides learner.authorized_keys)",
    )
    p.add_argument(
        "--insecure",
        action="store_true",
        help="allow a non-loopback --bind without keys "
        "(anyone who reaches the ports can register, submit rollouts and download the weights)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    from agentgym.host import early_signals
    from agentgym.learner.process import worker_rank

    rank_signals = None
    if worker_rank() is None:
        # A SIGTERM while torch loads (a job stopped as it starts): noted, and the run stops
        # cleanly once its loop runs (learner/stopping.py), instead of dying with no summary.
        early_signals.hold(signal.SIGTERM)
    else:
        from agentgym.learner.stopping import RankSignals

        # A rank > 0 never dies of a stop signal: it asks rank 0 to stop the run (from the start,
        # before torch loads, as a rank that is still starting is one rank 0 waits for).
        rank_signals = RankSignals(worker_rank() or 0)
    args = build_parser().parse_args(argv)
    if args.resume is not None:
        if args.config is None:
            args.config = args.resume / "config.toml"
        args.run_dir = args.resume
    flags = []
    if args.bind:
        flags.append(f'learner.bind="{args.bind}"')
    if args.max_steps is not None:
        flags.append(f"run.max_steps={args.max_steps}")
    if args.mode:
        flags.append(f'run.mode="{args.mode}"')
    if args.model:
        flags.append(f'model.path="{args.model}"')
    flags += [
        f'learner.{k}="{v}"'
        for k, v in (("secret_key", args.secret_key), ("authorized_keys", args.authorized_keys))
        if v
    ]
    if args.insecure:
        flags.append("learner.insecure=true")
    cfg = resolve_config(args, flags)
    from agentgym.auth.server import check_server_config

    # The config's own rules first (a refused bind needs nothing from this host), then what the
    # host must have: env names, sink libraries, the model (a local dir or the hub cache). Each
    # is one line, before torch loads.
    problem = check_server_config(cfg.learner)
    if problem:
        sys.stderr.write(f"error: {problem}\n")
        return 2
    cfg = preflight(cfg, "--model" if args.model else "model.path")
    if not Path(cfg.model.path).exists():  # model.create_tiny: the launcher makes the demo model, not the learner
        sys.stderr.write(
            f"error: model.path {cfg.model.path}: no model there yet; `agentgym train` makes the demo "
            f"model that model.create_tiny asks for (or: agentgym make-model {cfg.model.path})\n"
        )
        return 2
    from agentgym.learner.process import run_learner_process

    return run_learner_process(
        cfg,
        args.run_dir or cfg.run.path,
        resume=args.resume is not None,
        log_level=args.log_level,
        rank_signals=rank_signals,
    )


if __name__ == "__main__":
    raise SystemExit(main())
