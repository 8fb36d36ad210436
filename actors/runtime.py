"""The actor process: its components wired in one place, every task in one asyncio TaskGroup.

    uvloop.run(run_actor(cfg, run_dir))

Components (built in ``Actor.__init__``, one comment per collaborator):
  Actor        the learner connection (control link, Welcome, Hello/re-Hello, heartbeats), the
               engine's start, the process's life (signals, Leave, close)
  WeightSync   (actors/weight_sync.py) WeightsReady -> chunks -> engine.update_weights
  Players      (actors/play/players.py) tickets -> episodes -> Rollouts; env pools; hand-over on leave
  Concurrency  (actors/play/concurrency.py) how many groups to play at once
The engine, its tokenizer and the agent runner exist once the actor is registered and the engine
is up: ``Actor.run`` then passes them (a ``Serving``) to the players and the engine to the weight loop.

Links (made in ``Actor.run``):
  learner --Welcome/Grant/Ack/WeightsReady/Heartbeat/Shutdown--> receive_loop
  receive_loop --tickets--> players.tickets --> players (concurrency.target of them) --> engine + env pools
  players --Rollout--> learner; kept in ``players.unacked`` until the learner's Ack (re-sent after a re-hello)
  receive_loop --WeightsReady--> weights.run --pull chunks (this host's relay if any, else or on its
                 silence the learner)--> engine.update_weights (version bump)
  heartbeat_loop --Heartbeat--> learner; a learner silent past actor_timeout_s gets a new Hello;
                 each tick re-sizes the players (actors/play/concurrency.py) and reports the capacity
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
import uuid
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

import structlog
import zmq.asyncio

from agentgym.actors.engines.builders import load_tokenizer, make_engine
from agentgym.actors.play.concurrency import Concurrency, Signals
from agentgym.actors.play.players import Players, Serving
from agentgym.actors.transport import RECONNECT_AFTER_S, ControlLink
from agentgym.actors.weight_sync import WeightSync
from agentgym.auth.keys import ClientKeys, KeyFileError, load_public
from agentgym.config import Config, model_fingerprint
from agentgym.host import early_signals
from agentgym.observe.memstats import peak_memory
from agentgym.protocol import (
    Ack,
    Grant,
    Heartbeat,
    Hello,
    Leave,
    Message,
    Reject,
    Shutdown,
    WeightsReady,
    Welcome,
)
from agentgym.protocol.limits import actor_control_frame, agent_request_bytes
from agentgym.protocol.messages import LoraSpec

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from agentgym.actors.engines.engine import GatedEngine
    from agentgym.actors.play.agent_runner import AgentRunner

log = structlog.get_logger(__name__)

Started = tuple["GatedEngine", "PreTrainedTokenizerBase"]
"""An engine started, and its model's tokenizer."""


class Stop(Exception):
    """Raised inside the task group to end the actor (learner shutdown or a signal)."""

    def __init__(self, reason: str, code: int = 0, leave: bool = False) -> None:
        super().__init__(reason)
        self.reason, self.code = reason, code
        self.leave = leave
        """Asked to leave (a signal, the learner's leave request): hand over, then send Leave."""


class Actor:
    """The actor process: the learner connection and the process's life; builds its components."""

    def __init__(self, cfg: Config, actor_id: str | None = None) -> None:
        self.cfg = cfg
        self.actor_id = actor_id or uuid.uuid4().hex[:12]
        self.session = uuid.uuid4().hex  # this process's: its re-Hellos keep its id, another process's do not
        self.ctx = zmq.asyncio.Context()
        self.keys = ClientKeys.load(cfg.actor.secret_key, cfg.actor.learner_key)  # None: plain TCP
        # Frames from the learner are capped by the rollout limits (protocol/limits.py): this
        # config's until the learner's Welcome says its own (connect() raises the cap to them).
        self.link = ControlLink(
            self.ctx,
            cfg.actor.learner,
            self.actor_id,
            self.keys,
            max_frame=actor_control_frame(cfg.rollout.group_size, cfg.rollout.max_episode_tokens, cfg.actor.max_groups),
        )
        self.relay_keys: ClientKeys | None = None
        """CURVE to this host's weight relay: this actor's pair, the relay's public key."""
        if cfg.actor.relay_key is not None:
            if self.keys is None:
                raise KeyFileError(
                    "actor.relay_key needs actor.secret_key (the relay admits this actor by its key pair)"
                )
            self.relay_keys = ClientKeys(self.keys.public, self.keys.secret, load_public(cfg.actor.relay_key))
        self.welcome: Welcome | None = None
        """The learner's latest Welcome (connect() waits for the first)."""
        self.engine: GatedEngine | None = None
        """The policy's engine once started (``close`` stops it)."""
        self.agents: AgentRunner | None = None
        """Plays tickets with the user's agent program through the agent endpoint (actors/play/agent_runner.py); None: off."""
        self.serving: Serving | None = None
        """The engine, tokenizer and agent runner the players use, once all are up (``run``)."""
        self.stats = {"groups_sent": 0, "episodes_sent": 0, "acked": 0, "resent": 0, "weight_updates": 0}
        self.concurrency = Concurrency(cfg.actor.max_groups, cfg.actor.start_groups)
        self.weights = WeightSync(
            cfg.actor,  # the learner's address, the relay's, its stall time
            self.ctx,  # chunk requests on their own sockets
            self.keys,  # CURVE to the learner's weights port
            self.relay_keys,  # and to the relay's
            self.stats,  # weight_updates, weight_fetch_failures
        )
        """WeightsReady -> fetch -> engine update (actors/weight_sync.py)."""
        self.players = Players(
            cfg,  # env workers, step timeout, the critic's seed
            self.actor_id,  # named in each Rollout and Handover
            self.concurrency,  # players past its target idle
            self.weights,  # a ticket waits for its min_version; episodes take the latest turn limit
            self.stats,  # groups_sent, episodes_sent, hand-over and sampled-token counts
        )
        """Tickets -> episodes -> Rollouts; hand-over when leaving (actors/play/players.py)."""
        self.ack_statuses: dict[str, int] = {}
        self.learner_hint: dict[str, float] = {}
        """The learner's last heartbeat stats: staleness headroom and its stale-group count."""
        self.last_from_learner = time.monotonic()
        self.rehello = asyncio.Event()
        """Set to say Hello again (a learner restart or silence, a dropped connection)."""
        self.resend = asyncio.Event()
        """Set on each Welcome: the unacknowledged rollouts go again."""
        self.leave_asked: asyncio.Future[Stop] | None = None
        """Resolved by a signal or the learner's leave request (Shutdown.leave): see ``run``."""

    # ------------------------------------------------------------------ setup
    def hello(self, fingerprint: str) -> Hello:
        return Hello(
            actor_id=self.actor_id,
            hostname=socket.gethostname(),
            pid=os.getpid(),
            model_fingerprint=fingerprint,
            engine=self.cfg.actor.engine,
            max_groups=self.concurrency.target,
            session=self.session,
        )

    def _model_dir(self, welcome: Welcome) -> Path:
        """The actor's own model directory if it has one, else the learner's (shared filesystem)."""
        own = Path(self.cfg.model.path)
        return own if (own / "config.json").exists() else Path(welcome.model_path)

    async def connect(self) -> Welcome:
        own = Path(self.cfg.model.path)
        fp = model_fingerprint(own) if (own / "config.json").exists() else ""
        welcome = await self.link.handshake(self.hello(fp), self.cfg.actor.connect_timeout_s)
        if not fp:  # no local model: take the learner's path and announce that fingerprint
            fp = model_fingerprint(Path(welcome.model_path))
            if fp != welcome.model_fingerprint:
                raise FileNotFoundError(
                    f"this host has no model at {own} and the learner's {welcome.model_path} is "
                    "missing or different here; pass --model DIR with the same model"
                )
            welcome = await self.link.handshake(self.hello(fp), self.cfg.actor.connect_timeout_s)
        spec = welcome.rollout
        need = actor_control_frame(spec.group_size, spec.max_episode_tokens, self.cfg.actor.max_groups)
        if need > self.link.max_frame:
            # The learner's limits pass this config's: a Grant carrying hand-overs could be refused.
            # A cap holds for a connection's life, so connect again with the learner's (the
            # re-Hello gets the Welcome, weights and tickets again).
            log.info("control_frame_cap_raised", frame_cap_bytes=need, was=self.link.max_frame)
            self.link.close()
            await asyncio.sleep(RECONNECT_AFTER_S)  # the learner lets the old connection go first
            self.link = ControlLink(self.ctx, self.cfg.actor.learner, self.actor_id, self.keys, max_frame=need)
            welcome = await self.link.handshake(self.hello(fp), self.cfg.actor.connect_timeout_s)
        self.welcome = welcome
        log.info(
            "actor_registered",
            actor=welcome.actor_index,
            actor_id=self.actor_id,
            run_id=welcome.run_id,
            mode=welcome.mode,
        )
        return welcome

    async def start_engine(self, model_dir: Path, lora: LoraSpec | None = None) -> Started:
        log.info("engine_starting", engine=self.cfg.actor.engine, model=str(model_dir))  # vLLM takes a minute or more
        t0 = time.monotonic()
        # Importing torch/transformers and loading a tokenizer take seconds: off the loop, so
        # heartbeats go on meanwhile. Not beside the engine's start: the hf engine imports
        # transformers in a thread of its own, and two threads importing it at once can see it
        # half made ("cannot import name 'AutoModelForCausalLM'").
        tokenizer = await asyncio.to_thread(load_tokenizer, model_dir)
        t1 = time.monotonic()
        self.engine = engine = make_engine(self.cfg, model_dir, lora=lora)  # actor.engine: vllm | remote | hf | sim
        await engine.start()
        log.info(
            "engine_started",
            model=str(model_dir),
            seconds=round(time.monotonic() - t0, 1),
            tokenizer_s=round(t1 - t0, 1),
            lora=lora is not None,
        )
        return engine, tokenizer

    def _can_start_early(self) -> bool:
        """Whether the engine can start before the learner's Welcome: this host has the model
        directory (the Welcome could only point elsewhere when it has not) and its config asks
        for no LoRA adapters (the Welcome's ``lora`` shapes the engine)."""
        return (Path(self.cfg.model.path) / "config.json").exists() and self.cfg.learner.lora.rank == 0

    async def engine_up(self, welcome: Welcome, early: asyncio.Future[Started] | None) -> Serving:
        """The engine started, for the learner's Welcome: the one started before the handshake
        when it fits the Welcome (no LoRA adapters), else a new one; with the agent runner when
        the config asks for it."""
        started = await early if early is not None else None
        if started is not None and welcome.lora is not None:  # the learner trains adapters this config did not ask for
            log.info("engine_restarting", reason="the learner's Welcome asks for LoRA adapters")
            self.engine = None
            await started[0].close()
            started = None
        if started is None:
            started = await self.start_engine(self._model_dir(welcome), welcome.lora)
        engine, tokenizer = started
        if self.cfg.actor.agent_endpoint.enabled:  # the user's agent through an OpenAI-compatible endpoint
            from agentgym.actors.play.agent_runner import AgentRunner

            self.agents = AgentRunner(
                self.cfg.actor.agent_endpoint,
                engine,
                tokenizer,
                self.stats,
                max_request_bytes=agent_request_bytes(welcome.rollout.max_episode_tokens),
            )
            await self.agents.start()
        return Serving(engine=engine, tokenizer=tokenizer, agents=self.agents, spec=welcome.rollout, link=self.link)

    # ------------------------------------------------------------------ loops
    def dispatch(self, msg: Message) -> None:
        self.last_from_learner = time.monotonic()
        if isinstance(msg, Grant):
            self.players.granted(msg.tickets)
        elif isinstance(msg, Ack):
            for gid, status in zip(msg.group_ids, msg.statuses):
                if self.players.acked(gid):
                    self.stats["acked"] += 1
                    self.ack_statuses[status] = self.ack_statuses.get(status, 0) + 1
        elif isinstance(msg, WeightsReady):
            self.weights.offer(msg)
        elif isinstance(msg, Heartbeat):
            if msg.weight_version < 0:  # the learner does not know us (it restarted): re-register
                self.rehello.set()
            elif msg.stats:
                self.learner_hint = {k: float(v) for k, v in msg.stats.items() if isinstance(v, int | float)}
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
                self.weights.forget()
            self.welcome = msg
            self.resend.set()

    async def receive_loop(self) -> None:
        while True:
            self.dispatch(await self.link.recv())

    async def heartbeat_loop(self, welcome: Welcome) -> None:
        while True:
            await asyncio.sleep(welcome.heartbeat_interval_s)
            serving = self.serving
            if serving is not None:
                self.resize(serving)
            if drops := self.link.report_drops():  # connected again: say Hello (tickets, weights, resends)
                self.stats["learner_connection_drops"] = self.stats.get("learner_connection_drops", 0) + drops
                self.rehello.set()
            await self.link.send(
                Heartbeat(
                    actor_id=self.actor_id,
                    running_groups=self.players.running_groups,
                    weight_version=serving.engine.version if serving is not None else -1,
                    stats={
                        **{k: float(v) for k, v in self.stats.items()},
                        "capacity": float(self.concurrency.target),
                        **peak_memory(children=True),
                    },
                    weights_version=self.weights.served[0],
                    weights_digest=self.weights.served[1],
                )
            )
            if time.monotonic() - self.last_from_learner > welcome.actor_timeout_s:
                log.warning("learner_silent", seconds=round(time.monotonic() - self.last_from_learner, 1))
                self.rehello.set()

    def resize(self, serving: Serving) -> None:
        """One tick of the concurrency controller; players and env pools follow its target."""
        load = serving.engine.load()
        before = self.concurrency.target
        target = self.concurrency.update(
            Signals(
                busy=self.players.running_groups,
                kv_cache_usage=load.kv_cache_usage,
                waiting=load.waiting,
                running=load.running,
                headroom=self.learner_hint.get("headroom", -1.0),
                stale=self.learner_hint.get("stale_groups", 0.0),
            )
        )
        if target == before:
            return
        self.stats["capacity_changes"] = self.stats.get("capacity_changes", 0) + 1
        log.info(
            "capacity_changed",
            groups=target,
            previous=before,
            reason=self.concurrency.last_reason,
            kv_cache_usage=round(load.kv_cache_usage, 3),
            headroom=self.learner_hint.get("headroom"),
        )
        if not self.cfg.actor.env_workers:  # pools sized by the players' count follow it
            self.players.grow_pools(target * serving.spec.group_size)
        self.players.wake_idle()

    async def rehello_loop(self) -> None:
        """Re-register after a learner restart or a long silence, then re-send unacked rollouts."""
        while True:
            await self.rehello.wait()
            self.rehello.clear()
            if self.welcome is not None:  # registered (the loop starts after connect)
                await self.link.send(self.hello(model_fingerprint(self._model_dir(self.welcome))))
            self.last_from_learner = time.monotonic()

    async def resend_loop(self) -> None:
        while True:
            await self.resend.wait()
            self.resend.clear()
            unacked = list(self.players.unacked.values())
            for r in unacked:
                await self.link.send(r)
                self.stats["resent"] += 1
            if unacked:
                log.info("rollouts_resent", count=len(unacked))

    # ------------------------------------------------------------------ life
    async def run(self) -> Stop:
        loop = asyncio.get_running_loop()
        self.leave_asked = leave_asked = loop.create_future()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._on_signal, sig)
        if (held := early_signals.take()) is not None:  # came while torch loaded (agentgym/host/early_signals.py)
            self.ask_to_leave(Stop(f"got {held.name}", 0, leave=True))
        # The engine starts while the learner is awaited (the learner's own start-up is seconds of
        # imports and model loading), when it needs nothing from the Welcome.
        early = asyncio.ensure_future(self.start_engine(Path(self.cfg.model.path))) if self._can_start_early() else None
        # A signal while the learner is awaited ends the wait: nothing was taken, nothing to hand over.
        connecting = asyncio.ensure_future(self.connect())
        await asyncio.wait((connecting, leave_asked), return_when=asyncio.FIRST_COMPLETED)
        left = not connecting.done()
        if left or connecting.exception() is not None:
            # Asked to leave, no learner, or refused: an engine still starting is abandoned
            # (VllmEngine.start ends its processes), one already up is closed by close().
            tasks = [t for t in (connecting, early) if t is not None]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        if left:
            stop = leave_asked.result()
            log.info("actor_leaving", reason=stop.reason, handover=False, running_groups=0, registered=False)
            return Stop(stop.reason, stop.code)  # not registered: no Leave to send
        welcome = connecting.result()  # its error (no learner, refused) is the actor's
        # The learner's own model directory: the engine holds the weights of version 0 already
        # (set before the engine is up, so that a learner restart meanwhile can clear it).
        self.weights.synced = self._model_dir(welcome).resolve() == Path(welcome.model_path).resolve()
        structlog.contextvars.bind_contextvars(
            actor=welcome.actor_index
        )  # here, not in connect's task: every later log names it
        try:
            async with asyncio.TaskGroup() as tg:
                # Liveness first: an engine takes tens of seconds to start, and the learner must
                # keep hearing from us meanwhile or it returns our tickets to the pool.
                tg.create_task(self.receive_loop())  # learner -> dispatch
                tg.create_task(self.heartbeat_loop(welcome))  # liveness both ways
                tg.create_task(self.rehello_loop())  # re-register after learner restarts
                tg.create_task(self.resend_loop())  # unacked rollouts again after a Welcome
                tg.create_task(self.watch_leave(leave_asked))  # a signal or the learner's leave request
                self.serving = serving = await self.engine_up(welcome, early)  # players and weight updates need it
                tg.create_task(self.weights.run(serving.engine, welcome.weights_port))  # WeightsReady -> engine
                for n in range(self.cfg.actor.max_groups):  # those past concurrency.target idle
                    tg.create_task(self.players.play(n, serving))  # tickets -> episodes -> Rollout
        except* Stop as eg:
            stop = _first(eg)
        if stop.leave:
            leave = Leave(actor_id=self.actor_id, reason=stop.reason, handovers=self.players.handovers)
            with _ignore_errors():
                await asyncio.wait_for(self.link.send(leave), 5)
        return stop

    async def watch_leave(self, leave_asked: asyncio.Future[Stop]) -> None:
        """Once asked to leave: hand the live episodes over (when configured), then stop the actor."""
        from agentgym.actors.play.handover import leave

        stop = await leave_asked
        log.info(
            "actor_leaving",
            reason=stop.reason,
            handover=self.cfg.actor.handover,
            running_groups=self.players.running_groups,
        )
        if self.cfg.actor.handover:
            await leave(self.players)  # live episodes stop at a turn boundary and are handed over
        raise stop

    def _on_signal(self, sig: signal.Signals) -> None:
        self.ask_to_leave(Stop(f"got {signal.Signals(sig).name}", 0, leave=True))

    def ask_to_leave(self, stop: Stop) -> None:
        """Leave as on SIGTERM (the first request wins; later ones change nothing)."""
        if self.leave_asked is not None and not self.leave_asked.done():
            self.leave_asked.set_result(stop)

    async def close(self) -> None:
        if self.agents is not None:
            with _ignore_errors():
                await asyncio.wait_for(self.agents.close(), 10)
        for pool in self.players.pools.values():
            with _ignore_errors():
                await asyncio.wait_for(pool.close(), 10)
        if self.engine is not None:
            with _ignore_errors():
                await asyncio.wait_for(self.engine.close(), 30)
        self.link.close()
        self.ctx.term()


def _first(group: BaseExceptionGroup[Stop]) -> Stop:
    """The first Stop of a task group's (possibly nested) exception group."""
    first = group.exceptions[0]
    return first if isinstance(first, Stop) else _first(first)


class _ignore_errors:
    """Cleanup must go on: log and continue."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> bool:
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
        s["sampled_tokens"] = actor.engine.sampled_tokens
        s["sampled_tokens_lost"] = (
            s["sampled_tokens"] - s.get("sampled_tokens_sent", 0) - s.get("sampled_tokens_handed_over", 0)
        )
    log.info("actor_stopped", reason=stop.reason, **actor.stats, acks=actor.ack_statuses)
    (run_dir / "actors").mkdir(parents=True, exist_ok=True)
    import json

    (run_dir / "actors" / f"{actor.actor_id}.json").write_text(
        json.dumps(
            {
                "actor_id": actor.actor_id,
                "reason": stop.reason,
                **actor.stats,
                "acks": actor.ack_statuses,
                "unacked": len(actor.players.unacked),
                "memory": peak_memory(),
            },
            indent=2,
        )
    )
    return stop.code
