"""``agentgym``: the umbrella command.

agentgym --version                                            package and wire protocol versions
agentgym train [--config F] [--actors N] [-o KEY=VALUE ...]   learner + N local actors
agentgym envs                                                 registered environments
agentgym config [--config F] [-o ...]                         print the resolved config
agentgym eval --model DIR [--env E] [--tasks N] [-k K] [--temperature T]   avg@k, pass@k (eval.py)
agentgym view RUN_DIR [-o FILE]                               a page of the run's episodes and curves
agentgym keys DIR [--actors N]                                CURVE key pairs for learner and actors
agentgym chaos [--minutes M] [--seed S]                       train under random failures, print the accounting
agentgym make-model --arch ARCH DIR                           a random model of a real shape
agentgym slurm --run-dir DIR [--config F] [-o ...]            a run as the steps of a Slurm job (slurm.py)
agentgym actors leave ACTOR_ID --run RUN_DIR                  ask one actor to leave; it hands its episodes over
agentgym serve-env ENV [--kwargs JSON] [--port P]             an env over the AgentGym env-server HTTP API
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from agentgym.cli import bench as cmd_bench
from agentgym.cli import keys as cmd_keys
from agentgym.cli.args import add_config_args, preflight, resolve_config


def _version() -> str:
    """``agentgym VERSION (protocol N)``: the installed package's version and the wire protocol's."""
    from importlib.metadata import PackageNotFoundError, version

    from agentgym.protocol import PROTOCOL_VERSION

    try:
        v = version("agentgym")
    except PackageNotFoundError:  # run from a checkout that was never installed
        v = "unknown (not installed)"
    return f"agentgym {v} (protocol {PROTOCOL_VERSION})"


class _VersionAction(argparse.Action):
    """``--version``, with the versions looked up only when asked (the protocol import is not free)."""

    def __init__(self, option_strings: Sequence[str], dest: str, help: str | None = None, **_: object) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        print(_version())
        parser.exit()


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        # The reader went away (`agentgym config --explain | head -1`): stop quietly, as cat does.
        # stdout goes to /dev/null so the interpreter's final flush does not fail again.
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def _parser() -> tuple[argparse.ArgumentParser, dict[str, ModuleType]]:
    """The ``agentgym`` parser, and the subcommands that live in a module of their own (each adds
    its parser and runs its args)."""
    p = argparse.ArgumentParser(prog="agentgym", description="Asynchronous actor-learner RL for LLM agents.")
    p.add_argument("--version", action=_VersionAction, help="print the package and wire protocol versions and exit")
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser(
        "train",
        help="run a learner and local actors (separate processes over ZeroMQ)",
        description="Start one agentgym-learner and N agentgym-actor processes on this machine; they talk over "
        "real ZeroMQ sockets on loopback, as they would across hosts. The run ends when the learner ends; "
        "Ctrl-C stops all of them. Actor output goes to RUN_DIR/logs/actor-local-N.console.log.",
    )
    add_config_args(t)
    t.add_argument("--actors", type=int, help="local actor processes (overrides launch.actors)")
    t.add_argument("--run-dir", type=Path, help="run directory (default: run.dir/run.name)")
    t.add_argument("--max-steps", type=int, help="optimizer steps (overrides run.max_steps)")
    t.add_argument("--mode", choices=["async", "sync"], help="overrides run.mode")
    t.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --run-dir (default: run.dir/run.name) from its newest checkpoint; "
        "its config.toml is used unless --config is given",
    )
    t.add_argument(
        "--actor-log-level",
        default="warning",
        choices=["debug", "info", "warning", "error"],
        help="log level of the actors' console files (their JSON logs get everything)",
    )
    t.add_argument(
        "--keys",
        type=Path,
        help="CURVE keys from `agentgym keys DIR`: the learner's pair and allow-list, "
        "and the first actor pair for the local actors",
    )
    c = sub.add_parser("config", help="print the resolved config as TOML (unset keys as comments)")
    add_config_args(c)
    c.add_argument("--explain", action="store_true", help="every field: type, default, bounds, docstring")
    sub.add_parser("envs", help="list registered environments: what each is, what it needs, which are test-only")
    v = sub.add_parser(
        "view",
        help="write a page of what the agent did and how it learned (curves, episodes)",
        description="Write one self-contained HTML page from a run directory (finished or running): the run's "
        "curves (success, per env and held-out, avg@k/pass@k, reward, throughput, turn limit, loss, grad norm, "
        "lr, clip fraction, approx KL, importance weights, staleness; smoothing and hover as in TensorBoard) and "
        "the episodes the learner logged (learner.log_episodes per step), each as the conversation it trained "
        "on. Open it in any browser; it loads nothing from outside.",
    )
    v.add_argument("run_dir", type=Path, help="the run directory (RUN_DIR with metrics.jsonl, episodes.jsonl)")
    v.add_argument("-o", "--out", type=Path, help="where to write the page (default: RUN_DIR/view.html)")
    v.add_argument("--limit", type=int, default=2000, help="newest episodes to include (default: 2000)")
    from agentgym.cli import actors as cmd_actors
    from agentgym.cli import chaos as cmd_chaos
    from agentgym.cli import eval as cmd_eval
    from agentgym.cli import make_model as cmd_make_model
    from agentgym.cli import serve_env as cmd_serve_env
    from agentgym.cli import slurm

    # Subcommands that live in a module of their own: each adds its parser and runs its args.
    modules: dict[str, ModuleType] = {
        "bench": cmd_bench,
        "keys": cmd_keys,
        "chaos": cmd_chaos,
        "make-model": cmd_make_model,
        "eval": cmd_eval,
        "slurm": slurm,
        "actors": cmd_actors,
        "serve-env": cmd_serve_env,
    }
    for module in modules.values():
        module.add_parser(sub)
    return p, modules


def _main(argv: list[str] | None = None) -> int:
    p, modules = _parser()
    args = p.parse_args(argv)
    if args.cmd in modules:
        return modules[args.cmd].run(args)
    if args.cmd == "view":
        return _view(args)
    if args.cmd == "envs":
        return _envs()
    if args.cmd == "config":
        return _config(args)
    return _train(args)


def _view(args: argparse.Namespace) -> int:
    from agentgym.observe.viewer import write_page

    try:
        out = write_page(args.run_dir, args.out, args.limit)
    except (FileNotFoundError, ValueError) as exc:
        print(exc, file=sys.stderr)
        return 2
    print(out)
    return 0


def _envs() -> int:
    from agentgym.envpool.registry import describe_envs

    rows = describe_envs()
    width = max(len(n) for n, *_ in rows)
    for name, what, needs, test_only in rows:
        tag = " [test-only]" if test_only else ""
        print(f"{name:<{width}}  {what}{tag}" + (f"; needs {needs}" if needs != "-" else ""))
    return 0


def _config(args: argparse.Namespace) -> int:
    from agentgym.config import to_toml

    if args.explain:
        from agentgym.cli.explain import explain
        from agentgym.config import Config

        print(explain(Config))
        return 0
    print(to_toml(resolve_config(args, []), unset=True))
    return 0


def _train(args: argparse.Namespace) -> int:
    """``agentgym train``: the resolved, checked config, then the launcher."""
    flags = []
    if args.max_steps is not None:
        flags.append(f"run.max_steps={args.max_steps}")
    if args.mode:
        flags.append(f'run.mode="{args.mode}"')
    if args.actors is not None:
        flags.append(f"launch.actors={args.actors}")
    if args.resume and args.config is None:  # the run's own resolved config
        args.config = (args.run_dir or resolve_config(args, flags).run.path) / "config.toml"
    flags += cmd_keys.train_overrides(args.keys) if args.keys else []
    cfg = resolve_config(args, flags)
    cmd_keys.check_train_keys(cfg)
    # env names (and options, for the local actors), sink libraries, the model: one line before any process starts
    cfg = preflight(cfg, env_options=cfg.launch.actors > 0)
    from agentgym.cli.launch import launch
    from agentgym.host.guardian import start_guardian
    from agentgym.observe.logs import setup_logging

    run_dir = args.run_dir or cfg.run.path
    start_guardian()  # a killed launcher takes its learner and actors along
    setup_logging("launcher", run_dir / "logs" / "launcher.jsonl", args.log_level)
    return launch(
        cfg, args.config, [*args.override, *flags], run_dir, cfg.launch.actors, args.actor_log_level, resume=args.resume
    )


if __name__ == "__main__":
    sys.exit(main())
