"""``agentgym serve-env``: serve a registered env over the AgentGym env-server HTTP API
(envpool/server.py: the routes, the workers, the errors).

    agentgym serve-env guess_number --kwargs '{"high": 8}' --size 4 --port 8000

``python -m agentgym.envpool.server`` takes the same arguments and runs this command.
"""

from __future__ import annotations

import argparse
import json

from agentgym.cli.args import fail


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve-env",
        help="serve a registered env over the AgentGym env-server HTTP API",
        description="Serve a registered env over the AgentGym env-server HTTP API, each env in "
        "its own subprocess; Ctrl-C or SIGTERM stops it.",
    )
    p.add_argument("env", help="registered env name (see `agentgym envs`)")
    p.add_argument("--kwargs", default="{}", help="the env's options as a JSON object")
    p.add_argument("--size", type=int, default=4, help="env worker subprocesses (episodes at once)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0 = any free port")
    p.add_argument("--step-timeout", type=float, default=30, help="seconds an env may take per step")


def run(args: argparse.Namespace) -> int:
    try:
        kwargs = json.loads(args.kwargs)
    except ValueError as exc:
        raise fail(f"--kwargs is not JSON: {exc}") from None
    if not isinstance(kwargs, dict):
        raise fail(f"--kwargs must be a JSON object, got {args.kwargs}")
    from agentgym.envpool.server import EnvServer, serve_until_stopped
    from agentgym.observe.logs import setup_logging

    setup_logging("env-server")
    server = EnvServer(args.env, kwargs, args.size, host=args.host, port=args.port, step_timeout_s=args.step_timeout)
    return serve_until_stopped(server)
