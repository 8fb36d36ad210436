"""``agentgym-relay``: the command of a weight relay (agentgym/cluster/relay.py: what it does,
its failure handling and its keys).

    agentgym-relay --bind tcp://0.0.0.0:5560 --upstream tcp://LEARNER:5556 [--upstream tcp://OTHER_RELAY:5560]

This module parses and checks the flags, loads the keys and builds the ``Relay``;
``run_relay`` serves it. ``python -m agentgym.cluster.relay`` is this command too.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import zmq

from agentgym.auth.keys import ClientKeys, KeyFileError, load_keypair, load_public
from agentgym.cluster.relay import Relay, run_relay
from agentgym.protocol.limits import DEFAULT_CHUNK_MIB


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="agentgym-relay",
        description="a weight relay, so the learner's egress per update does not grow with actors.",
    )
    p.add_argument("--bind", default="tcp://127.0.0.1:5560", help="where actors (or child relays) connect")
    p.add_argument(
        "--upstream",
        action="append",
        required=True,
        help="the learner's weights address tcp://HOST:PORT+1, or another relay's; repeat for fallbacks, in order",
    )
    p.add_argument(
        "--upstream-key",
        action="append",
        type=Path,
        default=[],
        help="CURVE: each upstream's public key file, in the order of --upstream",
    )
    p.add_argument(
        "--secret-key", type=Path, help="CURVE: this relay's key pair file (an actor pair: see `agentgym keys`)"
    )
    p.add_argument("--authorized-keys", type=Path, help="CURVE: directory of the public keys this relay serves")
    p.add_argument("--insecure", action="store_true", help="allow a non-loopback bind without CURVE keys")
    p.add_argument("--stall", type=float, default=5.0, help="seconds of upstream silence before the next upstream")
    p.add_argument("--keep", type=int, default=2, help="versions kept in the cache")
    p.add_argument(
        "--chunk-mib",
        type=int,
        default=DEFAULT_CHUNK_MIB,
        help="the learner's learner.weight_chunk_mib: frames from upstream are refused past it (plus 1 MiB)",
    )
    p.add_argument(
        "--stats", type=Path, help="write the relay's counters here (JSON) every --stats-every s and on exit"
    )
    p.add_argument("--stats-every", type=float, default=10.0, help="seconds between counter writes (and debug logs)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument("--log-json", type=Path, help="JSON log file")
    args = p.parse_args(argv)
    from agentgym.config.sections import check_tcp

    try:  # one line naming the flag, not zmq's "Invalid argument" from bind or connect
        check_tcp(args.bind, "--bind")
        for up in args.upstream:
            check_tcp(up, "--upstream")
    except ValueError as exc:
        print(f"agentgym-relay: {exc}", file=sys.stderr)
        return 2

    from agentgym.auth.server import InsecureBind, ServerKeys, check_bind
    from agentgym.host.allocator import keep_freed_memory
    from agentgym.observe.logs import setup_logging

    keep_freed_memory()  # weight frames of one version freed are reused for the next's, as in actors
    setup_logging("relay", args.log_json, args.log_level)
    try:
        up_keys: list[ClientKeys | None] = [None] * len(args.upstream)
        if args.upstream_key:
            if args.secret_key is None or len(args.upstream_key) != len(args.upstream):
                raise KeyFileError("relay: --upstream-key needs --secret-key and one key per --upstream")
            public, secret = load_keypair(args.secret_key)
            up_keys = [ClientKeys(public, secret, load_public(k)) for k in args.upstream_key]
        server = ServerKeys.load(args.secret_key, args.authorized_keys) if args.authorized_keys else None
        try:
            check_bind(args.bind, server, args.insecure)
        except InsecureBind:
            raise InsecureBind(
                f"--bind {args.bind} is reachable from other hosts but the relay has no CURVE keys: anyone who "
                "reaches it could download the weights. Give it --secret-key and --authorized-keys, or accept the "
                "risk with --insecure"
            ) from None
        relay = Relay(
            args.bind,
            args.upstream,
            upstream_keys=up_keys,
            server_keys=server,
            stall_s=args.stall,
            keep=args.keep,
            chunk_mib=args.chunk_mib,
        )
    except (KeyFileError, InsecureBind, ValueError, zmq.ZMQError) as exc:
        print(f"agentgym-relay: {exc}", file=sys.stderr)
        return 2
    return run_relay(relay, args.stats, args.stats_every)


if __name__ == "__main__":
    sys.exit(main())
