"""Hosts made of Linux network namespaces, for tests and ``agentgym chaos``, which need a network.

    from agentgym.cluster.netns import Cluster, Loopback, netns_unavailable
    reason = netns_unavailable()            # None, or why namespaces cannot be made here
    with Cluster(["learner", "a1", "a2"]) as net:
        net.addr("learner")                 # "10.231.0.1": exists only inside these namespaces
        p = net.spawn("a1", [sys.executable, "-m", "agentgym.actors.main", ...], cwd=..., log=path)
        net.cut("a1"); net.restore("a1")    # the host's link down / up (TCP retransmits meanwhile)

Every host is a namespace with loopback and one veth link to a bridge that lives in a namespace
of its own (nothing is added to the caller's namespace). Addresses are 10.231.<subnet>.N/24,
one subnet per Cluster. There is no default route: no host can reach anything outside the
cluster. ``close`` (also on an exception inside ``with``) kills what ``spawn`` started and
deletes the namespaces, which deletes their links. Needs root (CAP_NET_ADMIN) and ``ip``.
A process killed before ``close`` leaves its namespaces behind (``ag<pid>-*``); the next Cluster
deletes those whose pid is no longer running and that hold no process (``sweep_stale``).

``Loopback`` has the same methods for machines where namespaces cannot be made: every host is
127.0.0.1 and a cut link is played by stopping the host's processes (SIGSTOP) until restored.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def netns_unavailable() -> str | None:
    """Why namespaces cannot be created here (not root, no ``ip``), or None when they can."""
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_NET_ADMIN); run as root to test across hosts"
    probe = f"agp{os.getpid() % 100000}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale() -> list[str]:
    """Delete the namespaces a dead Cluster left: named ``ag<pid>-*``, that pid not running, no
    process inside. Returns the names deleted."""
    listed = _ip("netns", "list", check=False)
    gone = []
    for line in listed.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        tag = name.split("-", 1)[0]
        if not (tag.startswith("ag") and tag[2:].isdigit() and "-" in name):
            continue
        if _running(int(tag[2:])) or _ip("netns", "pids", name, check=False).stdout.strip():
            continue
        if _ip("netns", "del", name, check=False).returncode == 0:
            gone.append(name)
    return gone


class Cluster:
    def __init__(self, hosts: list[str], subnet: int | None = None) -> None:
        self.tag = f"ag{os.getpid()}"  # the whole pid: sweep_stale reads it back
        self.subnet = subnet if subnet is not None else os.getpid() % 250 + 1
        self.hosts = {h: i + 1 for i, h in enumerate(hosts)}
        self.procs: list[subprocess.Popen] = []
        self.made: list[str] = []

    def ns(self, host: str) -> str:
        return f"{self.tag}-{host}" if host != "switch" else f"{self.tag}-sw"

    def addr(self, host: str) -> str:
        return f"10.231.{self.subnet}.{self.hosts[host]}"

    def _port(self, host: str) -> str:
        return f"v{self.hosts[host]}"  # the switch's end of the host's link

    def __enter__(self) -> Cluster:
        try:
            self._make()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _make(self) -> None:
        sweep_stale()  # a killed run's namespaces: its tag may be this pid's, its subnet this one
        sw = self.ns("switch")
        _ip("netns", "add", sw)
        self.made.append(sw)
        _ip("-n", sw, "link", "add", "br0", "type", "bridge")
        _ip("-n", sw, "link", "set", "br0", "up")
        for host in self.hosts:
            ns = self.ns(host)
            _ip("netns", "add", ns)
            self.made.append(ns)
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", self._port(host), "netns", sw)
            _ip("-n", ns, "addr", "add", f"{self.addr(host)}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", sw, "link", "set", self._port(host), "master", "br0")
            _ip("-n", sw, "link", "set", self._port(host), "up")

    def spawn(
        self, host: str, argv: list[str], cwd: Path, log: Path, env: dict[str, str] | None = None
    ) -> subprocess.Popen:
        """Start ``argv`` inside ``host``; its stdout and stderr go to ``log``."""
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            p = subprocess.Popen(
                ["ip", "netns", "exec", self.ns(host), *argv],
                cwd=cwd,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        self.procs.append(p)
        return p

    def cut(self, host: str) -> None:
        """Take the host's link down at the switch: its packets go nowhere until ``restore``."""
        _ip("-n", self.ns("switch"), "link", "set", self._port(host), "down")

    def restore(self, host: str) -> None:
        _ip("-n", self.ns("switch"), "link", "set", self._port(host), "up")

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)  # the process group: vLLM/engine children too
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 10
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for ns in reversed(self.made):
            _ip("netns", "del", ns, check=False)
        self.made.clear()


class Loopback(Cluster):
    """Every host on 127.0.0.1; ``cut`` freezes the host's processes (SIGSTOP), as silent as a
    lost link from the other side, and ``restore`` thaws them."""

    def __init__(self, hosts: list[str]) -> None:
        super().__init__(hosts)
        self.by_host: dict[str, list[subprocess.Popen]] = {h: [] for h in hosts}

    def addr(self, host: str) -> str:
        return "127.0.0.1"

    def _make(self) -> None:
        pass

    def spawn(
        self, host: str, argv: list[str], cwd: Path, log: Path, env: dict[str, str] | None = None
    ) -> subprocess.Popen:
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            p = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.procs.append(p)
        self.by_host[host].append(p)
        return p

    def _signal(self, host: str, sig: signal.Signals) -> None:
        for p in self.by_host[host]:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    pass

    def cut(self, host: str) -> None:
        self._signal(host, signal.SIGSTOP)

    def restore(self, host: str) -> None:
        self._signal(host, signal.SIGCONT)
