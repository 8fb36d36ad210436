"""Data-parallel ranks of the learner over torch.distributed (gloo on CPU, NCCL on GPU).

    dp = start_ranks(cfg, Trainer.build)   # in the learner process: rank 0; starts ranks 1..dp_size-1
    dp.send_step(batch)            # rank 0, every step: the whole collated batch to every rank
    dp.all_reduce_grads(params)    # every rank, once per optimizer step (learner.dp_mode = replicate)
    fsdp_shard(model, dp)          # every rank, once (learner.dp_mode = fsdp)

Launch (docs/adr/0007-learner-algorithms.md): the learner process is rank 0. It alone talks to
the actors (learner/service.py), collates each batch and broadcasts it; ``start_ranks`` starts the
other ranks as local processes (torch.multiprocessing, spawn) that build the same trainer with the
factory they are given (``Trainer.build``: this module drives a trainer and imports none) and wait
in :func:`_rank_main` for commands. Across hosts (docs/adr/0012-lora-and-multinode-learner.md)
every rank is started the torchrun way instead: RANK, WORLD_SIZE (and LOCAL_RANK, the GPU on its
host) in the environment, the rendezvous at ``learner.dist_init_addr`` or torchrun's
MASTER_ADDR/MASTER_PORT; ``agentgym-learner`` with RANK 0 is the learner, with RANK > 0 it runs
:func:`run_worker` (the same command loop), and ``start_ranks`` spawns nothing. Every rank computes the same advantages on the whole batch,
trains on its share of the rows, and the gradients are summed, so all ranks take the same
optimizer step. With ``learner.dp_mode = "replicate"`` every rank holds all the weights and one
flat all-reduce per optimizer step sums the gradients; rank 0 exports and saves the weights. With
``"fsdp"`` (:func:`fsdp_shard`, torch FSDP2) each rank holds one shard of every weight, gradient and
optimizer state; every forward and backward is then a collective (all-gather, reduce-scatter), so
all ranks run the same number of them, and exporting or saving gathers the full weights to rank 0
with every rank taking part. Each collective waits at most ``learner.dist_timeout_s``; a rank whose parent dies is
a daemon process and goes with it.

Stop signals: a rank > 0 never dies of SIGINT or SIGTERM (``RankSignals``, learner/stopping.py).
It writes a stop request to the rendezvous store (``STOP_KEY``), and rank 0, which watches for it
(:meth:`DataParallel.watch_stop_requests`), stops the run as on a signal of its own: the step
finishes, every rank takes part in the ``interrupted`` checkpoint, and ``stop`` ends the ranks.

Commands are one small broadcast object (``step`` / ``load`` / ``export`` / ``save`` / ``divergence`` /
``stop``); tensors travel with
``dist.broadcast``. The objects are pickled by torch.distributed: the peers must be the run's own
ranks, on the loopback store or, across hosts, on a private network (docs/adr/0012).
"""

from __future__ import annotations

import datetime
import os
import pickle
import socket
import threading
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from agentgym.config import Config
from agentgym.host import early_signals
from agentgym.learner.stopping import RankSignals, rank_process
from agentgym.learner.training.batch import Batch

log = structlog.get_logger(__name__)

STOP_KEY = "agentgym/stop_request"
"""The rendezvous store's key where a rank > 0 that got a stop signal writes why."""

BuildTrainer = Callable[[Config, "DataParallel"], Any]
"""Makes one rank's trainer (``Trainer.build``); the command loop calls its ``train_batch``,
``load_checkpoint``, ``export_weights``, ``save`` and ``params``."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pick_device(cfg: Config, rank: int) -> torch.device:
    """learner.device: auto -> cuda if available; with CUDA, rank r trains on GPU r."""
    want = cfg.learner.device
    if want == "auto":
        want = "cuda" if torch.cuda.is_available() else "cpu"
    if want == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("learner.device = 'cuda' but torch sees no CUDA device")
        if rank >= torch.cuda.device_count():
            raise RuntimeError(
                f"learner.dp_size = {cfg.learner.dp_size} needs one GPU per rank, "
                f"torch sees {torch.cuda.device_count()}"
            )
        return torch.device("cuda", rank)
    return torch.device("cpu")


@dataclass
class DataParallel:
    """This rank's view of the data-parallel group (world 1: no process group, no-ops)."""

    rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")
    procs: list[Any] | None = None
    init_method: str | None = None
    """The rendezvous (``tcp://HOST:PORT`` or ``env://``): its store carries the ranks' stop requests."""
    _mesh: Any = field(default=None, repr=False)
    _closing: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def active(self) -> bool:
        return self.world > 1

    # --------------------------------------------------------------- rank 0 -> others
    def _bcast_obj(self, obj: Any = None) -> Any:
        box = [obj]
        dist.broadcast_object_list(box, src=0, device=self.device if self.device.type == "cuda" else None)
        return box[0]

    def send_command(self, cmd: str, arg: Any = None) -> None:
        if self.active:
            self._bcast_obj((cmd, arg))

    def recv_command(self) -> tuple[str, Any]:
        return self._bcast_obj()

    def send_step(self, batch: Batch) -> Batch:
        """Rank 0: send ``batch`` to every rank; returns it on this rank's device."""
        tensors = {k: v.to(self.device) for k, v in batch.tensors().items()}
        if not self.active:
            return Batch.from_tensors(tensors)
        self._bcast_obj(("step", {k: (tuple(v.shape), v.dtype) for k, v in tensors.items()}))
        for v in tensors.values():
            dist.broadcast(v, src=0)
        return Batch.from_tensors(tensors)

    def recv_step(self, meta: dict[str, tuple[tuple[int, ...], torch.dtype]]) -> Batch:
        tensors = {k: torch.empty(shape, dtype=dtype, device=self.device) for k, (shape, dtype) in meta.items()}
        for v in tensors.values():
            dist.broadcast(v, src=0)
        return Batch.from_tensors(tensors)

    # --------------------------------------------------------------- collectives
    def all_reduce_(self, t: torch.Tensor, op: str = "sum") -> torch.Tensor:
        if self.active:
            dist.all_reduce(t, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
        return t

    def all_reduce_grads(self, params: list[torch.nn.Parameter]) -> None:
        """Sum the gradients of every rank (each rank's loss is already normalised globally)."""
        if not self.active:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for p, g in zip(params, grads, strict=True):
            n = g.numel()
            p.grad = flat[offset : offset + n].view_as(g).clone()
            offset += n

    def mesh(self) -> Any:
        """The 1-D device mesh of all ranks (FSDP shards over it)."""
        from torch.distributed.device_mesh import init_device_mesh

        if self._mesh is None:
            self._mesh = init_device_mesh(self.device.type, (self.world,))
        return self._mesh

    def broadcast_params(self, params: list[torch.Tensor]) -> None:
        """Make every rank hold rank 0's values (after building or loading)."""
        if self.active:
            for p in params:
                dist.broadcast(p.data, src=0)

    def max_divergence(self, params: Sequence[torch.Tensor]) -> float:
        """Largest |p − p on rank 0| over every parameter and rank: 0.0 when all ranks agree."""
        if not self.active:
            return 0.0
        flat = torch.cat([p.detach().reshape(-1).float() for p in params])
        ref = flat.clone()
        dist.broadcast(ref, src=0)
        d = (flat - ref).abs().max().reshape(1)
        dist.all_reduce(d, op=dist.ReduceOp.MAX)
        return float(d)

    def watch_stop_requests(self, request: Callable[[str], None]) -> None:
        """Rank 0: call ``request(reason)`` (from a thread of its own) when a rank > 0 got a stop
        signal, once; a request written before this call is seen at once. No-op with one rank."""
        if not self.active or self.rank != 0 or self.init_method is None:
            return
        store = store_client(self.init_method)

        def watch() -> None:
            while not self._closing.wait(0.5):
                try:
                    if store.check([STOP_KEY]):
                        request(store.get(STOP_KEY).decode())
                        return
                except Exception as exc:  # the store is gone: the run is ending anyway
                    if not self._closing.is_set():
                        log.warning("dp_stop_watch_failed", error=str(exc))
                    return

        threading.Thread(target=watch, name="dp-stop-requests", daemon=True).start()

    def close(self) -> None:
        self._closing.set()
        if not self.active:
            return
        if self.rank == 0:
            try:
                self.send_command("stop")
            except Exception as exc:  # a rank already gone: still reap the processes below
                log.warning("dp_stop_failed", error=str(exc))
            for p in self.procs or []:
                p.join(timeout=30)
                if p.is_alive():
                    p.terminate()
        if dist.is_initialized():
            dist.destroy_process_group()
        self.world = 1


def layer_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's repeated blocks (decoder layers), each one FSDP unit: the classes HF names in
    ``_no_split_modules``, else the entries of its ModuleLists. Empty for a model with neither."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    found = [m for m in model.modules() if type(m).__name__ in names]
    if found:
        return found
    return [m for lst in model.modules() if isinstance(lst, torch.nn.ModuleList) for m in lst]


def fsdp_shard(module: torch.nn.Module, dp: DataParallel) -> None:
    """Shard ``module`` in place over every rank (FSDP2 ``fully_shard``): one unit per layer of
    :func:`layer_modules`, the rest (embeddings, final norm, LM head) in the root unit.

    Gradients are summed over ranks, not averaged: each rank's loss is already its share of the
    global loss (learner/training/trainer.py), as with :meth:`DataParallel.all_reduce_grads`.
    """
    from torch.distributed.fsdp import FSDPModule, fully_shard

    # FSDP warns that a module returning a view loses its backward hook if the view is modified
    # in place; the trainer only reads the logits, hidden states and values it gets back.
    warnings.filterwarnings(
        "ignore", message=r"FSDP2-wrapped module \(.*\) returned a view tensor", category=UserWarning
    )
    mesh = dp.mesh()
    for layer in layer_modules(module):
        fully_shard(layer, mesh=mesh)
    fully_shard(module, mesh=mesh)
    for m in module.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)  # plain SUM: gloo has no PREMUL_SUM


def store_client(init_method: str) -> dist.TCPStore:
    """A client of the ranks' rendezvous store (``tcp://HOST:PORT``, or ``env://``: MASTER_ADDR and
    MASTER_PORT), separate from the process group's own connection to it."""
    if init_method == "env://":
        host, port = os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]
    else:
        host, port = init_method.removeprefix("tcp://").rsplit(":", 1)
    return dist.TCPStore(
        host.strip("[]"), int(port), is_master=False, timeout=datetime.timedelta(seconds=30), wait_for_workers=False
    )


@dataclass(frozen=True)
class LaunchEnv:
    """This process's place among learner ranks started the torchrun way."""

    rank: int
    world: int
    local_rank: int


def launch_env(environ: dict[str, str] | None = None) -> LaunchEnv | None:
    """RANK / WORLD_SIZE / LOCAL_RANK as torchrun sets them (LOCAL_RANK defaults to 0: one rank
    per host); None when WORLD_SIZE is unset (ranks, if any, are spawned locally)."""
    env = os.environ if environ is None else environ
    if "WORLD_SIZE" not in env:
        return None
    try:
        world, rank, local = int(env["WORLD_SIZE"]), int(env.get("RANK", "0")), int(env.get("LOCAL_RANK", "0"))
    except ValueError:
        raise ValueError(
            f"learner ranks: RANK, WORLD_SIZE and LOCAL_RANK must be integers, got RANK={env.get('RANK')!r} "
            f"WORLD_SIZE={env.get('WORLD_SIZE')!r} LOCAL_RANK={env.get('LOCAL_RANK')!r}"
        ) from None
    if world < 1 or not 0 <= rank < world or local < 0:
        raise ValueError(
            f"learner ranks: need 0 <= RANK < WORLD_SIZE and LOCAL_RANK >= 0, got RANK={rank} "
            f"WORLD_SIZE={world} LOCAL_RANK={local}"
        )
    return LaunchEnv(rank, world, local)


def rendezvous(cfg: Config, environ: dict[str, str] | None = None) -> str:
    """The init method of ranks started the torchrun way: learner.dist_init_addr, else env://
    (MASTER_ADDR and MASTER_PORT, which torchrun sets)."""
    env = os.environ if environ is None else environ
    if cfg.learner.dist_init_addr is not None:
        return cfg.learner.dist_init_addr
    missing = [k for k in ("MASTER_ADDR", "MASTER_PORT") if not env.get(k)]
    if missing:
        raise ValueError(
            f"learner ranks: WORLD_SIZE is set but {' and '.join(missing)} is not; set MASTER_ADDR and "
            "MASTER_PORT (torchrun does) or learner.dist_init_addr = 'tcp://RANK0_HOST:PORT'"
        )
    return "env://"


def _check_world(cfg: Config, le: LaunchEnv) -> None:
    if cfg.learner.dp_size not in (1, le.world):
        raise ValueError(
            f"learner.dp_size = {cfg.learner.dp_size} but WORLD_SIZE = {le.world}: ranks started the "
            "torchrun way take their number from WORLD_SIZE (leave dp_size at 1 or make them equal)"
        )


def route_interface(host: str) -> str | None:
    """The name of this host's network interface that traffic to ``host`` leaves by (None:
    loopback, or not found). No packet is sent: a UDP connect only asks the routing table."""
    import psutil

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, 9))
            local = s.getsockname()[0]
    except OSError:
        return None
    if local.startswith("127."):
        return None
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == local for a in addrs):
            return name
    return None


def _gloo_interface(init_method: str) -> None:
    """Gloo announces the address its host name resolves to, often 127.0.x.1 or one the other
    hosts cannot reach ("connectFullMesh failed ... remote=[127.0.0.1]"). Unless the user chose
    one (GLOO_SOCKET_IFNAME), use the interface that routes to the rendezvous host."""
    if os.environ.get("GLOO_SOCKET_IFNAME"):
        return
    host = (
        os.environ.get("MASTER_ADDR", "")
        if init_method == "env://"
        else init_method.removeprefix("tcp://").rsplit(":", 1)[0]
    )
    name = route_interface(host) if host else None
    if name is not None:
        os.environ["GLOO_SOCKET_IFNAME"] = name
        log.info("gloo_interface_chosen", interface=name, rendezvous=host)


def _init_group(cfg: Config, rank: int, world: int, init_method: str, device: torch.device) -> None:
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        _gloo_interface(init_method)
    dist.init_process_group(
        backend,
        init_method=init_method,
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=cfg.learner.dist_timeout_s),
        **({"device_id": device} if device.type == "cuda" else {}),  # type: ignore[arg-type]  # the one key, device_id, takes a device
    )


def start_ranks(cfg: Config, build: BuildTrainer) -> DataParallel:
    """Rank 0 of ``learner.dp_size`` ranks; the others start here as local processes, each with the
    trainer ``build`` makes (a picklable factory: ``Trainer.build``). Started the torchrun way
    (WORLD_SIZE in the environment), rank 0 of WORLD_SIZE ranks started elsewhere."""
    le = launch_env()
    if le is not None and le.world > 1:
        _check_world(cfg, le)
        if le.rank != 0:
            raise RuntimeError(
                f"learner rank {le.rank}: only rank 0 runs the learner service; ranks > 0 run "
                "run_worker (agentgym-learner does so when RANK > 0)"
            )
        device = pick_device(cfg, le.local_rank)
        init = rendezvous(cfg)
        _init_group(cfg, 0, le.world, init, device)
        log.info(
            "dp_started", world=le.world, backend=dist.get_backend(), device=str(device), launch="external", init=init
        )
        return DataParallel(0, le.world, device, init_method=init)
    world = cfg.learner.dp_size
    device = pick_device(cfg, 0)
    if world == 1:
        return DataParallel(0, 1, device)
    # Ranks spawned here are this host's children: the loopback interface is their network.
    init = f"tcp://127.0.0.1:{free_port()}"
    ctx = mp.get_context("spawn")
    procs = []
    # The arguments travel pickled: the child takes over its stop signals before unpickling them
    # imports torch (stopping.rank_process).
    payload = pickle.dumps((cfg, build, world, init))
    for rank in range(1, world):
        p = ctx.Process(target=rank_process, args=(rank, payload), daemon=True, name=f"learner-rank{rank}")
        p.start()
        procs.append(p)
    _init_group(cfg, 0, world, init, device)
    log.info("dp_started", world=world, backend=dist.get_backend(), device=str(device), pids=[p.pid for p in procs])
    return DataParallel(0, world, device, procs, init)


def run_worker(cfg: Config, build: BuildTrainer, signals: RankSignals | None = None) -> int:
    """A rank > 0 started the torchrun way (``agentgym-learner`` with RANK > 0): join the group,
    make the trainer with ``build`` and run rank 0's commands until it stops; 0 when stopped by rank 0.
    ``signals``: its stop signals, taken over as it started (agentgym/cli/learner.py)."""
    le = launch_env()
    if le is None or le.rank == 0:
        raise RuntimeError("run_worker: RANK > 0 and WORLD_SIZE must be set (a learner worker rank)")
    _check_world(cfg, le)
    init = rendezvous(cfg)
    log.info("dp_worker_starting", rank=le.rank, world=le.world, local_rank=le.local_rank, init=init)
    _rank_main(cfg, build, le.rank, le.world, init, le.local_rank, signals=signals)
    log.info("dp_worker_stopped", rank=le.rank)
    return 0


def _rank_main(
    cfg: Config,
    build: BuildTrainer,
    rank: int,
    world: int,
    init_method: str,
    local_rank: int | None = None,
    signals: RankSignals | None = None,
) -> None:
    """Ranks 1..: build the same trainer, then run rank 0's commands until ``stop``. A stop signal
    to this rank is passed to rank 0 (``signals``; taken over here when the caller has not)."""
    signals = signals or RankSignals(rank)
    if cfg.learner.threads:
        torch.set_num_threads(cfg.learner.threads)
    device = pick_device(cfg, rank if local_rank is None else local_rank)
    _init_group(cfg, rank, world, init_method, device)
    store = store_client(init_method)
    signals.connect(lambda reason: store.set(STOP_KEY, reason))
    dp = DataParallel(rank, world, device, init_method=init_method)
    trainer = build(cfg, dp)
    try:
        while True:
            cmd, arg = dp.recv_command()
            if cmd == "step":
                trainer.train_batch(dp.recv_step(arg))
            elif cmd == "load":
                trainer.load_checkpoint(arg)
            elif cmd == "export":
                trainer.export_weights()
            elif cmd == "save":
                trainer.save(None)
            elif cmd == "divergence":
                dp.max_divergence(trainer.params)
            elif cmd == "stop":
                break
            else:
                raise RuntimeError(f"learner rank {rank}: unknown command {cmd!r}")
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        early_signals.ignore_from_now()  # stopped by rank 0: a late signal to the job ends nothing
