"""``agentgym keys DIR``: CURVE key pairs for a learner and its actors, and where each file goes.

    agentgym keys keys/ --actors 3              # keys/learner.key(_secret), 3 actor pairs
    agentgym keys keys/ --name gpu-7            # add one more actor later (the learner pair is kept)
    agentgym train --keys keys/ ...             # local learner and actors use them

Layout and loading: agentgym/auth/keys.py; why CURVE: docs/adr/0009-authentication.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    k = sub.add_parser(
        "keys",
        help="write CURVE key pairs for the learner and actors (authentication + encryption)",
        description="Write a learner key pair and one key pair per actor, in ZeroMQ's certificate format, "
        "and print which file goes to which host. An existing learner pair in DIR is kept, so running it "
        "again adds actors.",
    )
    k.add_argument("dir", type=Path, help="directory to write the keys into")
    k.add_argument(
        "--actors",
        type=int,
        default=0,
        help="number of actor pairs named actor-0, actor-1, ... (after those already in DIR)",
    )
    k.add_argument("--name", action="append", default=[], help="an actor pair with this name (repeatable)")


def run(args: argparse.Namespace) -> int:
    from agentgym.auth.keys import KeyFileError, write_keys

    d: Path = args.dir
    start = len(list((d / "actors").glob("actor-*.key_secret"))) if (d / "actors").is_dir() else 0
    names = [*args.name, *(f"actor-{i}" for i in range(start, start + max(args.actors, 0)))]
    try:
        written = write_keys(d, names)
    except (KeyFileError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for p in written:
        print(f"wrote {p}")
    print(f"""
learner host: keep {d / "learner.key_secret"} (secret) and the directory {d / "authorized"}
    agentgym-learner --secret-key {d / "learner.key_secret"} --authorized-keys {d / "authorized"} --bind tcp://0.0.0.0:5555
each actor host: copy {d / "learner.key"} and that actor's own {d / "actors"}/NAME.key_secret (secret; nowhere else)
    agentgym-actor --learner tcp://LEARNER_HOST:5555 --learner-key learner.key --secret-key NAME.key_secret
one machine: agentgym train --keys {d}
an actor is admitted while its {d / "authorized"}/NAME.key is in the learner's directory (re-read on change).""")
    return 0


def train_overrides(d: Path) -> list[str]:
    """``agentgym train --keys DIR``: the learner's keys and the first actor pair for the local actors
    (they run on the learner's host; several actors may share one key pair)."""
    pairs = sorted((d / "actors").glob("*.key_secret"))
    if not pairs:
        raise SystemExit(
            f"error: --keys {d}: no actor key pair in {d / 'actors'} (write one: agentgym keys {d} --actors 1)"
        )
    return [
        f'learner.secret_key="{d / "learner.key_secret"}"',
        f'learner.authorized_keys="{d / "authorized"}"',
        f'actor.secret_key="{pairs[0]}"',
        f'actor.learner_key="{d / "learner.key"}"',
    ]


def check_train_keys(cfg: object) -> None:
    """Local actors of a keyed learner need keys too: say so now rather than time out later."""
    lc, ac = cfg.learner, cfg.actor  # type: ignore[attr-defined]  # cfg: a Config, typed object here
    if lc.secret_key is not None and ac.secret_key is None and cfg.launch.actors:  # type: ignore[attr-defined]  # cfg: a Config
        raise SystemExit(
            "error: learner.secret_key is set but the local actors have no keys: "
            "use --keys DIR, or set actor.secret_key and actor.learner_key"
        )
