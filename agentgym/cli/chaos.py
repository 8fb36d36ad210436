"""``agentgym chaos``: a learner and actors on one machine, with random kills and link cuts.

    agentgym chaos --minutes 5 --seed 1 [--work DIR] [--loopback]

Hosts are network namespaces when this runs as root (``agentgym.cluster.netns``: a learner host and
actor hosts on a private bridge, 10.231.x.0/24), else processes on loopback where a cut link is
played by freezing the host's processes. Every ``--every`` seconds (randomised) one of these
happens: an actor's link is cut for longer than ``learner.actor_timeout_s`` and restored; an
actor is SIGKILLed and a new one started; the learner is SIGKILLed and restarted with
``--resume``. At the end the learner gets SIGTERM (it checkpoints and writes summary.json) and
the ticket accounting is printed (learner/records/accounting.py): every issued ticket is trained,
expired, stale, invalid, failed, untrained or in flight at the end; ``unaccounted`` must be 0.
Exit code 0 when the accounting holds, 1 when it does not.

``Scenario`` (agentgym/cluster/scenario.py) drives one such cluster.
Actors run from another working directory with no model of their own and no config: they take
the learner's model path and everything about playing from its Welcome.
"""

from __future__ import annotations

import argparse
import random
import signal
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from agentgym.cluster.netns import Cluster, Loopback, netns_unavailable
from agentgym.cluster.scenario import FAST, Scenario


def _past(sc: Scenario, step: int) -> Callable[[], bool]:
    """A condition for ``sc.wait``: the run has trained past ``step``."""
    return lambda: sc.step() > step


def _chaos(sc: Scenario, minutes: float, seed: int, every: float, timeout_s: float) -> list[str]:
    rng = random.Random(seed)
    done: list[str] = []
    hosts = ["a1", "a2"]
    live = {h: sc.start_actor(h) for h in hosts}
    sc.start_learner()
    sc.wait(lambda: sc.step() >= 2, 300, "first steps")
    end = time.monotonic() + 60 * minutes
    while time.monotonic() < end:
        time.sleep(rng.uniform(0.5 * every, 1.5 * every))
        kind = rng.choice(["cut", "cut", "kill_actor", "kill_actor", "kill_learner"])
        if kind == "kill_learner" and not sc.checkpoints():
            kind = "cut"
        host = rng.choice(hosts)
        at = sc.step()
        if kind == "cut":
            seconds = rng.uniform(1.5, 3.0) * timeout_s
            sc.net.cut(host)
            time.sleep(seconds)
            sc.net.restore(host)
            done.append(f"step {at}: cut {host} for {seconds:.1f} s")
        elif kind == "kill_actor":
            sc.kill(sc.actors[live[host]])
            live[host] = sc.start_actor(host)
            done.append(f"step {at}: SIGKILL actor {host}, started {live[host]}")
        else:
            assert sc.learner is not None
            sc.kill(sc.learner)
            sc.start_learner(resume=True)
            done.append(f"step {at}: SIGKILL learner, resumed from step {sc.checkpoints()[-1]}")
        print(done[-1], flush=True)
        sc.wait(_past(sc, at), 300, "a step after the event")  # the run goes on
    assert sc.learner is not None
    sc.learner.send_signal(signal.SIGTERM)
    sc.learner.wait(timeout=120)
    return done


def add_parser(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser(
        "chaos",
        help="train under random kills and link cuts; print the ticket accounting",
        description=__doc__.split("\n\n")[2],
    )
    c.add_argument("--minutes", type=float, default=5.0, help="how long to inflict failures (default: 5)")
    c.add_argument("--seed", type=int, default=0, help="seed of the failure sequence")
    c.add_argument("--every", type=float, default=20.0, help="mean seconds between failures (default: 20)")
    c.add_argument("--work", type=Path, help="where the run and consoles go (default: a temporary directory, kept)")
    c.add_argument("--loopback", action="store_true", help="processes on 127.0.0.1 even when namespaces are possible")
    c.add_argument(
        "--engine", default="hf", choices=["hf", "vllm"], help="actors' engine (default: hf, starts in a second)"
    )


def run(args: argparse.Namespace) -> int:
    from agentgym.learner.records.accounting import format_table
    from agentgym.models.tiny import make_default_tiny_model

    work = args.work or Path(tempfile.mkdtemp(prefix="agentgym-chaos-"))
    model = work / "model" / "tiny"
    if not (model / "config.json").exists():
        make_default_tiny_model(model, seed=0)
    why = netns_unavailable() if not args.loopback else "--loopback"
    net = Loopback(["learner", "a1", "a2"]) if why else Cluster(["learner", "a1", "a2"])
    print(f"hosts: {'loopback processes (' + why + ')' if why else 'network namespaces'}; work: {work}", flush=True)
    overrides = [*FAST, "run.max_steps=100000"]
    with net:
        sc = Scenario(net, work, model.resolve(), overrides, engine=args.engine)
        events = _chaos(sc, args.minutes, args.seed, args.every, 6.0)
    summary = sc.summary()
    acc = summary["tickets"]
    print(f"\n{len(events)} failures in {args.minutes:g} min (seed {args.seed}); learner steps {summary['step']}")
    print(format_table(acc))
    ok = acc["unaccounted"] == 0 and acc["accepted_not_buffered"] == 0
    print("accounting holds" if ok else "ACCOUNTING BROKEN")
    return 0 if ok else 1
