"""A real Slurm cluster on this machine, for tests: munged, slurmctld and one slurmd per node,
each node a network-namespace host (tests/netns.py) with a hostname of its own.

    reason = slurm_unavailable()               # None, or why Slurm cannot run here
    with SlurmCluster(tmp_path, nodes=3) as slurm:
        job = slurm.sbatch(["-N", "3", "script.sbatch", ...], env=...)
        slurm.state(job)                       # "RUNNING", "COMPLETED", ...

Debian's slurm-wlm and munge (scripts/system-packages.txt). Everything the daemons write (keys,
state, spool, logs, the munge socket) is under the given directory; nothing in /etc is used.
Each host runs in a UTS namespace of its own, so slurmd finds its node by its hostname, and
``ip netns exec`` gives it its own address: srun, the job's steps and the processes they start
see exactly what they would on separate machines (the filesystem is shared, as on a cluster).
A requeued job is held for the credentials' lifetime (cred_expire, 120 s by default; 10 s
here). Without cgroup support Slurm 22.05's slurmd does not start; a cluster that does not come up
raises SlurmUnavailable with the daemon's log, which the tests turn into a skip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from netns import Cluster, netns_unavailable

BINARIES = (
    "munged",
    "slurmctld",
    "slurmd",
    "sbatch",
    "srun",
    "scontrol",
    "squeue",
    "scancel",
)


GPU_STANDINS = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random")
"""Character devices that stand in for GPUs in gres.conf (at most this many GPUs per node)."""


class SlurmUnavailable(RuntimeError):
    """Slurm's daemons did not come up here (the message says why)."""


def slurm_unavailable() -> str | None:
    """Why a Slurm cluster cannot be made here, or None."""
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        return f"Slurm is not installed ({', '.join(missing)} missing; apt-get install slurm-wlm munge)"
    return netns_unavailable()


class SlurmCluster:
    def __init__(self, work: Path, nodes: int = 3, cpus: int = 2, gpus: int = 0) -> None:
        self.dir = work / "slurm"
        self.names = [f"n{i + 1}" for i in range(nodes)]
        self.cpus = cpus
        self.gpus = gpus
        """GPUs declared per node (gres ``gpu``, each backed by a character device that is not one:
        Slurm allocates and binds them, sets CUDA_VISIBLE_DEVICES, and nothing opens them)."""
        self.net = Cluster(["ctl", *self.names])
        self.conf = self.dir / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    def __enter__(self) -> SlurmCluster:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self) -> None:
        d = self.dir
        for sub in ("state", *[f"spool/{n}" for n in self.names]):
            (d / sub).mkdir(parents=True, exist_ok=True)
        key = d / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        self.munge_sock = d / "munge.sock"
        # --force: munged refuses a socket under a world-writable directory (/tmp) otherwise.
        subprocess.run(
            [
                "munged",
                "--force",
                f"--socket={self.munge_sock}",
                f"--key-file={key}",
                f"--pid-file={d / 'munged.pid'}",
                f"--log-file={d / 'munged.log'}",
                f"--seed-file={d / 'munged.seed'}",
            ],
            check=True,
            timeout=30,
        )
        self.net.__enter__()
        net = self.net
        gres = f" Gres=gpu:{self.gpus}" if self.gpus else ""
        nodes = "\n".join(
            f"NodeName={n} NodeAddr={net.addr(n)} CPUs={self.cpus} RealMemory=1000{gres} State=UNKNOWN"
            for n in self.names
        )
        if self.gpus:
            devices = GPU_STANDINS[: self.gpus]
            (d / "gres.conf").write_text(
                "AutoDetect=off\n"
                + "".join(f"NodeName={','.join(self.names)} Name=gpu File={dev}\n" for dev in devices)
            )
        self.conf.write_text(f"""ClusterName=agentgymtest
SlurmctldHost=ctl({net.addr("ctl")})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_sock},cred_expire=10
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
ReturnToService=2
KillWait=20
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.%n.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.%n.log
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobCompType=jobcomp/none
{"GresTypes=gpu" if self.gpus else ""}
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
SwitchType=switch/none
{nodes}
PartitionName=debug Nodes={",".join(self.names)} Default=YES MaxTime=INFINITE State=UP
""")
        # Slurm 22.05's slurmd loads a cgroup plugin whatever the proctrack plugin: v1 where the
        # machine mounts the v1 hierarchies, which it only reads here.
        (d / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nCgroupAutomount=no\n")
        self._daemon("ctl", "slurmctld -D -i")
        for n in self.names:
            self._daemon(n, "slurmd -D")
        deadline = time.monotonic() + 60
        while True:
            states = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False).stdout.split()
            if states[1::2] == ["idle"] * len(self.names):
                return
            if time.monotonic() > deadline:
                raise SlurmUnavailable(f"the nodes did not come up ({states}):\n{self.logs()}")
            time.sleep(0.5)

    def _daemon(self, host: str, cmd: str) -> None:
        # A UTS namespace per host: the daemon (and every job step under it) sees its node's name.
        argv = ["unshare", "--uts", "sh", "-c", f"hostname {host} && exec {cmd}"]
        self.net.spawn(host, argv, cwd=self.dir, log=self.dir / f"{host}.console.log", env=self.env)

    def logs(self, lines: int = 15) -> str:
        out = []
        for f in sorted(self.dir.glob("*.log")):
            out.append(f"== {f.name}\n" + "\n".join(f.read_text(errors="replace").splitlines()[-lines:]))
        return "\n".join(out)

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """A Slurm client command, run from the controller's host."""
        p = subprocess.run(
            ["ip", "netns", "exec", self.net.ns("ctl"), *argv], env=self.env, capture_output=True, text=True, timeout=60
        )
        if check and p.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({p.returncode}): {p.stderr.strip()}")
        return p

    def sbatch(self, args: list[str], env: dict[str, str], cwd: Path) -> str:
        p = subprocess.run(
            ["ip", "netns", "exec", self.net.ns("ctl"), "sbatch", "--parsable", *args],
            env={**env, "SLURM_CONF": str(self.conf)},
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if p.returncode != 0:
            raise RuntimeError(f"sbatch failed ({p.returncode}): {p.stderr.strip()}")
        return p.stdout.strip().split(";")[0]

    def state(self, job: str) -> str:
        """The job's state (PENDING, RUNNING, COMPLETED, ...); ``scontrol`` keeps finished jobs
        for MinJobAge (300 s)."""
        for field in self.run("scontrol", "show", "job", "--oneliner", job).stdout.split():
            if field.startswith("JobState="):
                return field.split("=", 1)[1]
        return "UNKNOWN"

    def steps(self, job: str) -> dict[str, str]:
        """Running steps of the job: name -> step id (``JOB.N``)."""
        out = self.run("squeue", "-h", "-s", "-j", job, "-o", "%i %j", check=False).stdout
        return {name: sid for sid, name in (line.split(None, 1) for line in out.splitlines() if line.strip())}

    def close(self) -> None:
        # Job steps run under slurmstepd, which leaves slurmd's process group: every process in
        # the hosts' namespaces goes, then the daemons and the namespaces themselves.
        for host in self.net.made:
            pids = subprocess.run(["ip", "netns", "pids", host], capture_output=True, text=True).stdout.split()
            for p in pids:
                try:
                    os.kill(int(p), 9)
                except (ValueError, ProcessLookupError):
                    pass
        self.net.close()
        pid = self.dir / "munged.pid"
        if pid.exists():
            try:
                os.kill(int(pid.read_text().strip()), 15)
            except (ValueError, ProcessLookupError):
                pass
