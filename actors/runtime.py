"""The actor process: its components wired in one place, every task in one asyncio TaskGroup.

    uvloop.run(run_actor(cfg, run_dir))

Links (made in ``Actor.run``):
  learner --Welcome/Grant/Ack/WeightsReady/Heartbeat/Shutdown--> receive_loop
  receive_loop --tickets--> ticket queue --> players (actors/playing.py; concurrency.target of them) --> engine + env pools
  players --Rollout--> learner; kept in ``unacked`` until the learner's Ack (re-sent after a re-hello)
  receive_loop --WeightsReady--> weight_loop (actors/weight_sync.py) --pull chunks (this host's relay if any, else or on its
                 silence the learner)--> engine.update_weights (version bump)
  heartbeat_loop --Heartbeat--> learner; a learner silent past actor_timeout_s gets a new Hello;
                 each tick re-sizes the players (actors/concurrency.py) and reports the capacity
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
import uuid
from pathlib import Path

import structlog
import zmq.asyncio

from agentgym.config import Config, model_fingerprint
from agentgym.actors.concurrency import Concurrency, Signals
from agentgym.actors.engines import load_tokenizer, make_engine
from agentgym.observe.memstats import peak_memory
from agentgym.actors.transport import RECONNECT_AFTER_S, ControlLink
from agentgym.actors.playing import Playing
from agentgym.actors.weight_sync import WeightSync
from agentgym.auth.keys import ClientKeys, KeyFileError, load_public
from agentgym.host import early_signals
from agentgym.protocol.limits import actor_control_frame, agent_request_bytes
from agentgym.protocol.weights import WeightBuffers
from agentgym.protocol import (
    Ack,
    Grant,
    Handover,
    Heartbeat,
    Hello,
    Leave,
    Message,
    Reject,
    Rollout,
    Shutdown,
    Ticket,
    WeightsReady,
    Welcome,
)
from agentgym.protocol.messages import LoraSpec

log = structlog.get_logger(__name__)


class Stop(Exception):
    """Raised inside the task group to end the actor (learner shutdown or a signal)."""

    def __init__(self, reason: str, code: int = 0, leave: bool = False) -> None:
        super().__init__(reason)
        self.reason, self.code = reason, code
        self.leave = leave
        """Asked to leave (a signal, the learner's leave request): hand over, then send Leave."""


class Actor(WeightSync, Playing):
    def __init__(self, cfg: Config, actor_id: str | None = None) -> None:
        self.cfg = cfg
        self.actor_id = actor_id or uuid.uuid4().hex[:12]
        self.session = uuid.uuid4().hex  # this process's: its re-Hellos keep its id, another process's do not
        self.served = (-1, -1)  # (version, weights digest) the engine serves: heartbeats report it
        self.ctx = zmq.asyncio.Context()
        self.keys = ClientKeys.load(cfg.actor.secret_key, cfg.actor.learner_key)  # None: plain TCP
        # Frames from the learner are capped by the rollout limits (protocol/limits.py): this
        # config's until the learner's Welcome says its own (connect() raises the cap to them).
        self.link = ControlLink(self.ctx, cfg.actor.learner, self.actor_id, self.keys,
                                max_frame=actor_control_frame(cfg.rollout.group_size, cfg.rollout.max_episode_tokens,
                                                              cfg.actor.max_groups))  # fmt: skip
        self.relay_keys = None  # CURVE to this host's weight relay: this actor's pair, the relay's public key
        if cfg.actor.relay_key is not None:
            if self.keys is None:
                raise KeyFileError("actor.relay_key needs actor.secret_key (the relay admits this actor by its key pair)")
            self.relay_keys = ClientKeys(self.keys.public, self.keys.secret, load_public(cfg.actor.relay_key))
        self.welcome: Welcome | None = None
        self.engine = None
        self.tokenizer = None
        self.pools: dict[str, object] = {}
        self.pools_lock = asyncio.Lock()
        self.agents = None
        """Plays tickets with the user's agent program through the agent endpoint (actors/agent_runner.py); None: off."""
        self.tickets: asyncio.Queue[Ticket] = asyncio.Queue()
        self.known_tickets: set[str] = set()
        self.unacked: dict[str, Rollout] = {}
        self.latest_ready: WeightsReady | None = None
        self.weights_wanted = asyncio.Event()
        self.weight_buffers = WeightBuffers()
        """Where fetched weights land, kept from one update for the next (no page faults after the first)."""
        self.version_changed = asyncio.Condition()
        self.turn_limit = 1
        self.turn_limits: dict[str, int] = {}
        """Per-env limits of the latest WeightsReady (an env not in it plays ``turn_limit``)."""
        self.running_groups = 0
        self.concurrency = Concurrency(cfg.actor.max_groups, cfg.actor.start_groups)
        self.capacity_changed = asyncio.Event()
        self.learner_hint: dict[str, float] = {}
        """The learner's last heartbeat stats: staleness headroom and its stale-group count."""
        self.last_from_learner = time.monotonic()
        self.stats = {"groups_sent": 0, "episodes_sent": 0, "acked": 0, "resent": 0, "weight_updates": 0}
        self.leaving = asyncio.Event()  # set on SIGTERM: episodes stop at a turn boundary (actors/handover.py)
        self.leave_asked: asyncio.Future[Stop] | None = None
        """Resolved by a signal or the learner's leave request (Shutdown.leave): see ``run``."""
        self.handovers: list[Handover] = []  # what the Leave carries to the learner
        self.ack_statuses: dict[str, int] = {}
        self.engine_ready = asyncio.Event()
        self.weights_synced = False
        """True once the engine holds the learner's weights of ``engine.version``: at once when it
        loaded the learner's own model directory, else after the first fetch (a directory with the
        same architecture and tokenizer may hold other weights)."""

    # ------------------------------------------------------------------ setup
    def hello(self, fingerprint: str) -> Hello:
        return Hello(
            actor_id=self.actor_id, hostname=socket.gethostname(), pid=os.getpid(),
            model_fingerprint=fingerprint, engine=self.cfg.actor.engine, max_groups=self.concurrency.target,
            session=self.session,
        )  # fmt: skip

    def _model_dir(self) -> Path:
        """The actor's own model directory if it has one, else the learner's (shared filesystem)."""
        own = Path(self.cfg.model.path)
        return own if (own / "config.json").exists() else Path(self.welcome.model_path)

    async def connect(self) -> None:
        own = Path(self.cfg.model.path)
        fp = model_fingerprint(own) if (own / "config.json").exists() else ""
        self.welcome = await self.link.handshake(self.hello(fp), self.cfg.actor.connect_timeout_s)
        if not fp:  # no local model: take the learner's path and announce that fingerprint
            fp = model_fingerprint(Path(self.welcome.model_path))
            if fp != self.welcome.model_fingerprint:
                raise FileNotFoundError(
                    f"this host has no model at {own} and the learner's {self.welcome.model_path} is "
                    "missing or different here; pass --model DIR with the same model"
                )
            self.welcome = await self.link.handshake(self.hello(fp), self.cfg.actor.connect_timeout_s)
        spec = self.welcome.rollout
        need = actor_control_frame(spec.group_size, spec.max_episode_tokens, self.cfg.actor.max_groups)
        if need > self.link.max_frame:
            # The learner's limits pass this config's: a Grant carrying hand-overs could be refused.
            # A cap holds for a connection's life, so connect again with the learner's (the
            # re-Hello gets the Welcome, weights and tickets again).
            log.info("control_frame_cap_raised", frame_cap_bytes=need, was=self.link.max_frame)
            self.link.close()
            await asyncio.sleep(RECONNECT_AFTER_S)  # the learner lets the old connection go first
            self.link = ControlLink(self.ctx, self.cfg.actor.learner, self.actor_id, self.keys, max_frame=need)
            self.welcome = await self.link.handshake(self.hello(fp), self.cfg.actor.connect_timeout_s)
        log.info("actor_registered", actor=self.welcome.actor_index, actor_id=self.actor_id, run_id=self.welcome.run_id,
                 mode=self.welcome.mode)  # fmt: skip

    async def start_engine(self, lora: LoraSpec | None = None) -> None:
        model_dir = self._model_dir()
        log.info("engine_starting", engine=self.cfg.actor.engine, model=str(model_dir))  # vLLM takes a minute or more
        t0 = time.monotonic()
        # Importing torch/transformers and loading a tokenizer take seconds: off the loop, so
        # heartbeats go on meanwhile.
        self.tokenizer = await asyncio.to_thread(load_tokenizer, model_dir)
        t1 = time.monotonic()
        self.engine = make_engine(self.cfg, model_dir, lora=lora)  # actor.engine: vllm | remote | hf | sim
        await self.engine.start()
        log.info("engine_started", model=str(model_dir), seconds=round(time.monotonic() - t0, 1),
                 tokenizer_s=round(t1 - t0, 1), lora=lora is not None)  # fmt: skip

    def _can_start_early(self) -> bool:
        """Whether the engine can start before the learner's Welcome: this host has the model
        directory (the Welcome could only point elsewhere when it has not) and its config asks
        for no LoRA adapters (the Welcome's ``lora`` shapes the engine)."""
        return (Path(self.cfg.model.path) / "config.json").exists() and self.cfg.learner.lora.rank == 0

    async def engine_up(self, early: asyncio.Future[None] | None) -> None:
        """The engine started, for the learner's Welcome: the one started before the handshake
        when it fits the Welcome (no LoRA adapters), else a new one."""
        if early is not None:
            await early
            if self.welcome.lora is not None:  # the learner trains adapters this config did not ask for
                log.info("engine_restarting", reason="the learner's Welcome asks for LoRA adapters")
                engine, self.engine = self.engine, None
                await engine.close()
        if self.engine is None:
            await self.start_engine(self.welcome.lora)

    # ------------------------------------------------------------------ loops
    def dispatch(self, msg: Message) -> None:
        self.last_from_learner = time.monotonic()
        if isinstance(msg, Grant):
            for t in msg.tickets:
                if t.group_id not in self.known_tickets:
                    self.known_tickets.add(t.group_id)
                    self.tickets.put_nowait(t)
        elif isinstance(msg, Ack):
            for gid, status in zip(msg.group_ids, msg.statuses):
                if self.unacked.pop(gid, None) is not None:
                    self.stats["acked"] += 1
                    self.ack_statuses[status] = self.ack_statuses.get(status, 0) + 1
                self.known_tickets.discard(gid)
        elif isinstance(msg, WeightsReady):
            if self.latest_ready is None or msg.version >= self.latest_ready.version:
                self.latest_ready = msg
                self.weights_wanted.set()
        elif isinstance(msg, Heartbeat):
            if msg.weight_version < 0:  # the learner does not know us (it restarted): re-register
                self.rehello.set()
            elif msg.stats:
                self.learner_hint = dict(msg.stats)
        elif isinstance(msg, Shutdown) and msg.leave:  # only this actor goes: as on SIGTERM
            self.ask_to_leave(Stop(f"learner asked this actor to leave: {msg.reason}", 0, leave=True))
        elif isinstance(msg, Shutdown):
            raise Stop(f"learner: {msg.reason}")
        elif isinstance(msg, Reject):
            raise Stop(f"learner rejected this actor ({msg.field}): {msg.reason}", code=2)
        elif isinstance(msg, Welcome):
            if self.welcome is not None and msg.run_id != self.welcome.run_id:
                # A restarted learner resumed from a checkpoint: its weights may be older than
                # ours, and only its weights make trainable groups. Take its next WeightsReady.
                log.info("learner_restarted", run_id=msg.run_id, engine_version=getattr(self.engine, "version", -1))
                self.latest_ready = None
                self.weights_synced = False
            self.welcome = msg
            self.resend.set()

    async def receive_loop(self) -> None:
        while True:
            self.dispatch(await self.link.recv())

    async def heartbeat_loop(self) -> None:
        w = self.welcome
        while True:
            await asyncio.sleep(w.heartbeat_interval_s)
            if self.engine_ready.is_set():
                self.resize()
            if drops := self.link.report_drops():  # connected again: say Hello (tickets, weights, resends)
                self.stats["learner_connection_drops"] = self.stats.get("learner_connection_drops", 0) + drops
                self.rehello.set()
            await self.link.send(Heartbeat(
                actor_id=self.actor_id, running_groups=self.running_groups,
                weight_version=self.engine.version if self.engine_ready.is_set() else -1,
                stats={**{k: float(v) for k, v in self.stats.items()}, "capacity": float(self.concurrency.target),
                       **peak_memory(children=True)},
                weights_version=self.served[0], weights_digest=self.served[1],
            ))  # fmt: skip
            if time.monotonic() - self.last_from_learner > w.actor_timeout_s:
                log.warning("learner_silent", seconds=round(time.monotonic() - self.last_from_learner, 1))
                self.rehello.set()

    def resize(self) -> None:
        """One tick of the concurrency controller; players and env pools follow its target."""
        load = self.engine.load()
        before = self.concurrency.target
        target = self.concurrency.update(Signals(
            busy=self.running_groups, kv_cache_usage=load.kv_cache_usage, waiting=load.waiting, running=load.running,
            headroom=self.learner_hint.get("headroom", -1.0), stale=self.learner_hint.get("stale_groups", 0.0),
        ))  # fmt: skip
        if target == before:
            return
        self.stats["capacity_changes"] = self.stats.get("capacity_changes", 0) + 1
        log.info("capacity_changed", groups=target, previous=before, reason=self.concurrency.last_reason,
                 kv_cache_usage=round(load.kv_cache_usage, 3), headroom=self.learner_hint.get("headroom"))  # fmt: skip
        if not self.cfg.actor.env_workers:
            for pool in self.pools.values():
                pool.grow(target * self.welcome.rollout.group_size)
        self.capacity_changed.set()
        self.capacity_changed = asyncio.Event()

    async def rehello_loop(self) -> None:
        """Re-register after a learner restart or a long silence, then re-send unacked rollouts."""
        while True:
            await self.rehello.wait()
            self.rehello.clear()
            await self.link.send(self.hello(model_fingerprint(self._model_dir())))
            self.last_from_learner = time.monotonic()

    async def resend_loop(self) -> None:
        while True:
            await self.resend.wait()
            self.resend.clear()
            for r in list(self.unacked.values()):
                await self.link.send(r)
                self.stats["resent"] += 1
            if self.unacked:
                log.info("rollouts_resent", count=len(self.unacked))

    async def run(self) -> Stop:
        self.rehello = asyncio.Event()
        self.resend = asyncio.Event()
        loop = asyncio.get_running_loop()
        self.leave_asked = loop.create_future()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, lambda s=sig: self.ask_to_leave(Stop(f"got {signal.Signals(s).name}", 0, leave=True)))
        if (held := early_signals.take()) is not None:  # came while torch loaded (agentgym/host/early_signals.py)
            self.ask_to_leave(Stop(f"got {held.name}", 0, leave=True))
        # The engine starts while the learner is awaited (the learner's own start-up is seconds of
        # imports and model loading), when it needs nothing from the Welcome.
        early = asyncio.ensure_future(self.start_engine()) if self._can_start_early() else None
        # A signal while the learner is awaited ends the wait: nothing was taken, nothing to hand over.
        connecting = asyncio.ensure_future(self.connect())
        await asyncio.wait((connecting, self.leave_asked), return_when=asyncio.FIRST_COMPLETED)
        left = not connecting.done()
        if left or connecting.exception() is not None:
            # Asked to leave, no learner, or refused: an engine still starting is abandoned
            # (VllmEngine.start ends its processes), one already up is closed by close().
            tasks = [t for t in (connecting, early) if t is not None]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        if left:
            stop = self.leave_asked.result()
            log.info("actor_leaving", reason=stop.reason, handover=False, running_groups=0, registered=False)
            return Stop(stop.reason, stop.code)  # not registered: no Leave to send
        connecting.result()  # its error (no learner, refused) is the actor's
        # The learner's own model directory: the engine holds the weights of version 0 already
        # (set before the engine is up, so that a learner restart meanwhile can clear it).
        self.weights_synced = self._model_dir().resolve() == Path(self.welcome.model_path).resolve()
        structlog.contextvars.bind_contextvars(actor=self.welcome.actor_index)  # here, not in connect's task: every later log names it

        async def watch_signal() -> None:
            from agentgym.actors.handover import leave

            stop = await self.leave_asked
            log.info("actor_leaving", reason=stop.reason, handover=self.cfg.actor.handover, running_groups=self.running_groups)
            if self.cfg.actor.handover:
                await leave(self)  # live episodes stop at a turn boundary and are handed over
            raise stop

        try:
            async with asyncio.TaskGroup() as tg:
                # Liveness first: an engine takes tens of seconds to start, and the learner must
                # keep hearing from us meanwhile or it returns our tickets to the pool.
                tg.create_task(self.receive_loop())  # learner -> dispatch
                tg.create_task(self.heartbeat_loop())  # liveness both ways
                tg.create_task(self.rehello_loop())  # re-register after learner restarts
                tg.create_task(self.resend_loop())  # unacked rollouts again after a Welcome
                tg.create_task(watch_signal())
                await self.engine_up(early)  # players and weight updates need it
                if self.cfg.actor.agent_endpoint.enabled:  # the user's agent through an OpenAI-compatible endpoint
                    from agentgym.actors.agent_runner import AgentRunner

                    self.agents = AgentRunner(self.cfg.actor.agent_endpoint, self.engine, self.tokenizer, self.stats,
                                              max_request_bytes=agent_request_bytes(self.welcome.rollout.max_episode_tokens))  # fmt: skip
                    await self.agents.start()
                self.engine_ready.set()
                tg.create_task(self.weight_loop())  # WeightsReady -> fetch -> engine update
                for n in range(self.cfg.actor.max_groups):  # those past concurrency.target idle
                    tg.create_task(self.player(n))  # tickets -> episodes -> Rollout
        except* Stop as eg:
            stop = eg.exceptions[0]
        if stop.leave:
            with _ignore_errors():
                await asyncio.wait_for(self.link.send(Leave(actor_id=self.actor_id, reason=stop.reason, handovers=self.handovers)), 5)
        return stop

    def ask_to_leave(self, stop: Stop) -> None:
        """Leave as on SIGTERM (the first request wins; later ones change nothing)."""
        if self.leave_asked is not None and not self.leave_asked.done():
            self.leave_asked.set_result(stop)

    async def close(self) -> None:
        if self.agents is not None:
            with _ignore_errors():
                await asyncio.wait_for(self.agents.close(), 10)
        for pool in self.pools.values():
            with _ignore_errors():
                await asyncio.wait_for(pool.close(), 10)
        if self.engine is not None:
            with _ignore_errors():
                await asyncio.wait_for(self.engine.close(), 30)
        self.link.close()
        self.ctx.term()


class _ignore_errors:
    """Cleanup must go on: log and continue."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, et, exc, tb) -> bool:
        if exc is not None:
            log.warning("cleanup_error", error=repr(exc))
        return True


async def run_actor(cfg: Config, run_dir: Path, actor_id: str | None = None) -> int:
    actor = Actor(cfg, actor_id)
    try:
        stop = await actor.run()
    finally:
        await actor.close()
    s = actor.stats
    if actor.engine is not None and actor.agents is None:
        # Sampled but neither sent nor handed over: what leaving (or the run's end) threw away.
        s["sampled_tokens"] = getattr(actor.engine, "sampled_tokens", 0)
        s["sampled_tokens_lost"] = s["sampled_tokens"] - s.get("sampled_tokens_sent", 0) - s.get("sampled_tokens_handed_over", 0)
    log.info("actor_stopped", reason=stop.reason, **actor.stats, acks=actor.ack_statuses)
    (run_dir / "actors").mkdir(parents=True, exist_ok=True)
    import json

    (run_dir / "actors" / f"{actor.actor_id}.json").write_text(json.dumps(
        {"actor_id": actor.actor_id, "reason": stop.reason, **actor.stats, "acks": actor.ack_statuses,
         "unacked": len(actor.unacked), "memory": peak_memory()}, indent=2))  # fmt: skip
    return stop.code
