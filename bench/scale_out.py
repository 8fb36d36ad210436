"""Weight distribution to N simulated actors on several hosts: straight from the learner vs relays.

    python bench/scale_out.py --out /tmp/scale_out          # N = 1, 8, 32, 128
    python bench/scale_out.py --actors 8,32 --mib 8 --hosts 4 --plot docs/img/scale_out.png

Every run is real processes in network namespaces (agentgym/cluster/netns.py): a ``learner`` host with
the learner's weight side (``agentgym.cluster.fleet source``: the learner's own Hub, no training) and up
to ``--hosts`` actor hosts, each running its share of the N simulated actor identities
(``agentgym.cluster.fleet actors``, ``--per-process`` identities per process, actors/engines/sim_engine.py). The
source publishes ``--versions`` versions of ``--mib`` MiB; for each it measures:
- time to all: from announcing the version (WeightsReady to every actor) to the last actor
  reporting, by heartbeat, that it serves the version with the learner's bytes (crc32 digest);
- learner egress: payload bytes the learner's weights port sent for that version, in copies of
  the version (``Hub.weight_bytes_served``).
Modes: ``direct`` (every actor fetches from the learner, as before relays) and ``relay`` (one
``agentgym-relay`` per actor host, arranged as a binary tree: host 0's relay fetches from the
learner, host i's from host (i-1)//2's; actors fetch from their host's relay, the learner as
fallback). Versions after the first are reported (the first includes connection setup).
``--link-mbit`` limits every host's outgoing link (tc tbf on its veth), so the network rather
than the CPU bounds the transfer, as between real machines.
Writes OUT/scale_out.json, prints a markdown table, and plots time and egress against N.
Figures depend on the machine: a shared 2-core box is CPU-bound (every actor still checks and
assembles its own copy), so time to all measures CPU there as much as distribution.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentgym.cluster.netns import Cluster

ROOT = Path(__file__).resolve().parents[1]


def _limit_links(net: Cluster, names: list[str], mbit: float) -> None:
    """Caps what each named host's NIC sends at ``mbit`` Mbit/s (a token bucket on eth0)."""
    for h in names:
        subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                net.ns(h),
                "tc",
                "qdisc",
                "add",
                "dev",
                "eth0",
                "root",
                "tbf",
                "rate",
                f"{mbit}mbit",
                "burst",
                "256kb",
                "latency",
                "2s",
            ],
            check=True,
        )


def run_one(n: int, mode: str, args: argparse.Namespace, work: Path) -> dict:
    from agentgym.cluster.netns import Cluster

    hosts = [f"h{i}" for i in range(min(args.hosts, n))]
    py = sys.executable
    work.mkdir(parents=True, exist_ok=True)
    out = work / "result.json"
    with Cluster(["learner", *hosts]) as net:
        L = net.addr("learner")
        if args.link_mbit:  # every host's NIC sends at most this fast: the network, not the CPU, is the limit
            _limit_links(net, ["learner", *hosts], args.link_mbit)
        source = net.spawn(
            "learner",
            [
                py,
                "-m",
                "agentgym.cluster.fleet",
                "source",
                "--bind",
                f"tcp://{L}:5555",
                "--actors",
                str(n),
                "--versions",
                str(args.versions),
                "--mib",
                str(args.mib),
                "--chunk-kib",
                str(args.chunk_kib),
                "--timeout",
                "600",
                "--out",
                str(out),
            ],
            ROOT,
            work / "source.log",
        )
        for i, h in enumerate(hosts):
            relay = None
            if mode == "relay":
                up = f"tcp://{L}:5556" if i == 0 else f"tcp://{net.addr(hosts[(i - 1) // 2])}:5560"
                ups = ["--upstream", up] + (["--upstream", f"tcp://{L}:5556"] if i else [])
                net.spawn(
                    h,
                    [
                        py,
                        "-m",
                        "agentgym.cluster.relay",
                        "--bind",
                        f"tcp://{net.addr(h)}:5560",
                        "--insecure",
                        *ups,
                        "--stats",
                        str(work / f"relay-{h}.json"),
                    ],
                    ROOT,
                    work / f"relay-{h}.log",
                )
                relay = f"tcp://{net.addr(h)}:5560"
            share = n // len(hosts) + (1 if i < n % len(hosts) else 0)
            for p in range(0, share, args.per_process):
                count = min(args.per_process, share - p)
                net.spawn(
                    h,
                    [
                        py,
                        "-m",
                        "agentgym.cluster.fleet",
                        "actors",
                        "--learner",
                        f"tcp://{L}:5555",
                        "--count",
                        str(count),
                        "--prefix",
                        f"{h}p{p}",
                        "--stall",
                        "10",
                        *(["--relay", relay] if relay else []),
                    ],
                    ROOT,
                    work / f"fleet-{h}-{p}.log",
                )
        deadline = time.monotonic() + 900
        while source.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        if source.returncode != 0:
            raise RuntimeError(
                f"{mode} N={n}: the source failed; see {work}/source.log:\n{(work / 'source.log').read_text()[-2000:]}"
            )
    versions = json.loads(out.read_text())["versions"][1:]
    return {
        "actors": n,
        "mode": mode,
        "hosts": len(hosts),
        "time_to_all_s": statistics.median(v["time_to_all_s"] for v in versions),
        "egress_copies": statistics.median(v["egress_copies"] for v in versions),
        "per_version": versions,
    }


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for mode, style in (("direct", "o-"), ("relay", "s-")):
        rs = sorted((r for r in rows if r["mode"] == mode), key=lambda r: r["actors"])
        xs = [r["actors"] for r in rs]
        ax1.plot(xs, [r["egress_copies"] for r in rs], style, label=mode)
        ax2.plot(xs, [r["time_to_all_s"] for r in rs], style, label=mode)
    for ax, title in (
        (ax1, "learner egress per update (copies of the weights)"),
        (ax2, "time to all actors serving it (s)"),
    ):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("simulated actors (N)")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend()
    ax1.set_yscale("log", base=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--actors", default="1,8,32,128", help="comma-separated N")
    p.add_argument("--modes", default="direct,relay")
    p.add_argument("--hosts", type=int, default=4, help="actor hosts (network namespaces)")
    p.add_argument("--per-process", type=int, default=16, help="actor identities per fleet process")
    p.add_argument("--versions", type=int, default=3)
    p.add_argument("--mib", type=float, default=8.0)
    p.add_argument("--chunk-kib", type=int, default=512)
    p.add_argument(
        "--link-mbit", type=float, default=0, help="limit every host's outgoing link to this (tc tbf; 0: no limit)"
    )
    p.add_argument("--out", type=Path, default=Path("/tmp/scale_out"))
    p.add_argument("--plot", type=Path, help="also write the plot here (e.g. docs/img/scale_out.png)")
    args = p.parse_args()
    load = os.getloadavg()
    rows = []
    for n in [int(x) for x in args.actors.split(",")]:
        for mode in args.modes.split(","):
            row = run_one(n, mode, args, args.out / f"{mode}-{n}")
            rows.append(row)
            print(
                f"{mode:6s} N={n:4d}: time to all {row['time_to_all_s']:.2f} s, egress {row['egress_copies']:.2f} copies",
                flush=True,
            )
    result = {
        "rows": rows,
        "mib": args.mib,
        "chunk_kib": args.chunk_kib,
        "hosts": args.hosts,
        "link_mbit": args.link_mbit,
        "loadavg_before": load,
        "loadavg_after": os.getloadavg(),
        "cpus": os.cpu_count(),
        "uptime": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "scale_out.json").write_text(json.dumps(result, indent=2))
    plot(rows, args.plot or args.out / "scale_out.png")
    print(
        "\n| N | hosts | direct: egress (copies) | relay: egress (copies) | direct: time to all (s) | relay: time to all (s) |"
    )
    print("|---|---|---|---|---|---|")
    for n in sorted({r["actors"] for r in rows}):
        d = next((r for r in rows if r["actors"] == n and r["mode"] == "direct"), None)
        r = next((r for r in rows if r["actors"] == n and r["mode"] == "relay"), None)
        cell = lambda x, k, f: f.format(x[k]) if x else "-"  # noqa: E731
        print(
            f"| {n} | {(d or r)['hosts']} | {cell(d, 'egress_copies', '{:.2f}')} | {cell(r, 'egress_copies', '{:.2f}')} | "
            f"{cell(d, 'time_to_all_s', '{:.2f}')} | {cell(r, 'time_to_all_s', '{:.2f}')} |"
        )
    print(f"\nload average before {load}, after {os.getloadavg()}, {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
