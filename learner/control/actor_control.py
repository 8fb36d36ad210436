"""The learner's actor-facing side: who may play, what a rollout is worth, who is still there.

    control = ActorControl(cfg, hub, run_dir=..., run_id=..., sched=..., ...)  # learner/service.py wires it
    nursery.start_soon(control.control_loop)
    nursery.start_soon(control.reaper)

``control_loop`` reads the hub's inbox (Hello, Heartbeat, Rollout, Leave): a Hello is checked
against the model and answered with Welcome (and the current WeightsReady and grants); a rollout
is claimed against its ticket, judged (duplicate, invalid, eval, failed, the staleness verdict,
the group filter) and acked, and an accepted one goes into the buffer for the learner's
``train_loop`` (``wait_rollouts`` wakes it); ``reaper`` drops actors silent past
``actor_timeout_s`` (their tickets are issued again) and sends every actor the learner's
heartbeat with the staleness headroom. ``grant`` hands out tickets wherever the scheduler has
room; ``announce_weights`` tells every actor of a new version.

``ActorControl`` owns what only it writes: the rollout guard, the dedupe set, the group filter,
the actors' memory figures and the latest WeightsReady. The scheduler, the train buffer, the
ticket journal, the counters, the episode mix, the evaluations and the flight recorder are the
learner's too; they are passed in. The learner's weight version is read through ``version``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

import msgspec
import structlog
import trio

from agentgym.config import Config, model_fingerprint
from agentgym.learner.control.dedupe import SeenSet
from agentgym.learner.control.evaluation import Evaluations
from agentgym.learner.control.group_filter import GroupFilter
from agentgym.learner.control.scheduler import ActorState, Scheduler
from agentgym.learner.control.staleness import StalenessRule, TrainBuffer
from agentgym.learner.control.validate import Guard, vocab_size
from agentgym.learner.model.lora import lora_spec
from agentgym.learner.records.accounting import TicketLedger
from agentgym.learner.records.flight_recorder import FlightRecorder
from agentgym.learner.records.flowstats import EpisodeMix
from agentgym.learner.records.run_stats import Counters
from agentgym.learner.training.batch import trainable_episodes
from agentgym.learner.transport import Hub
from agentgym.protocol import (
    AckStatus,
    CriticSpec,
    Grant,
    Handover,
    Heartbeat,
    Hello,
    Leave,
    Reject,
    Rollout,
    RolloutSpec,
    Shutdown,
    WeightsReady,
    Welcome,
)
from agentgym.protocol.arrays import I32, U8, unpack

log = structlog.get_logger(__name__)


def handover_digest(token_ids: bytes) -> str:
    """A short digest of a handed-over prefix's token ids (logged; tests compare it with the
    trained episode's first ``resumed_at`` tokens)."""
    import hashlib

    return hashlib.sha256(token_ids).hexdigest()[:16]


def rollout_spec(cfg: Config) -> RolloutSpec:
    """How actors play, from the learner's config: what every Welcome carries."""
    rc = cfg.rollout
    return RolloutSpec(
        group_size=rc.group_size,
        max_tokens_per_turn=rc.max_tokens_per_turn,
        max_episode_tokens=rc.max_episode_tokens,
        temperature=rc.temperature,
        top_p=rc.top_p,
        env_kwargs={e.name: dict(e.kwargs) for e in cfg.env.specs},
        system_prompt=rc.system_prompt,
        critic=critic_spec(cfg) if cfg.critic.enabled else None,
        allow_special_tokens=rc.allow_special_tokens,
    )


def critic_spec(cfg: Config) -> CriticSpec:
    """The config's ``[critic]`` in its wire form, whether or not it is enabled."""
    return CriticSpec(**cfg.critic.model_dump(exclude={"enabled"}))


def version_span(r: Rollout, default: int) -> tuple[int, int]:
    """(oldest, newest) weight version behind the agent tokens of the group's usable episodes."""
    agent = [v for e in trainable_episodes(r) if (v := unpack(e.versions, I32)[unpack(e.loss_mask, U8) > 0]).size]
    if not agent:
        return default, default
    return min(int(v.min()) for v in agent), max(int(v.max()) for v in agent)


class ActorControl:
    """The actors' side of the learner: registration, tickets, rollouts, liveness, leave requests.
    See the module docstring; learner/service.py builds it and hands it the parts it shares."""

    def __init__(
        self,
        cfg: Config,
        hub: Hub,
        *,
        run_dir: Path,
        run_id: str,
        version: Callable[[], int],
        sched: Scheduler,
        rule: StalenessRule,
        buffer: TrainBuffer,
        ledger: TicketLedger,
        counters: Counters,
        mix: EpisodeMix,
        evals: Evaluations,
        flight: FlightRecorder,
    ) -> None:
        self.cfg = cfg
        self.hub = hub
        """Where the actors' messages come from and answers go (learner/transport.py)."""
        self.run_dir = run_dir
        """Where ``agentgym actors leave`` requests arrive (learner/control/requests.py)."""
        self.run_id = run_id
        self.version = version
        """The weight version the learner serves now (its steps trained)."""
        self.sched = sched
        self.rule = rule
        self.buffer = buffer
        self.ledger = ledger
        self.counters = counters
        self.mix = mix
        self.evals = evals
        self.flight = flight
        self.fingerprint = model_fingerprint(cfg.model.path)
        """The model every actor must run (a Hello with another is rejected)."""
        self.guard = Guard(
            group_size=cfg.rollout.group_size,
            max_episode_tokens=cfg.rollout.max_episode_tokens,
            vocab_size=vocab_size(cfg.model.path),
        )
        """Which tickets are whose, and what a rollout must be to be judged (learner/control/validate.py)."""
        self.filter = GroupFilter(cfg.learner.filter_groups, cfg.learner.batch_groups)  # dynamic sampling, in judge
        self.seen = SeenSet()
        """Group ids answered, compact (learner/control/dedupe.py): checkpointed, whatever the run's length."""
        self.weights_msg: WeightsReady | None = None
        """The latest version's announcement: a newly registered actor gets it with its Welcome."""
        self.actor_memory: dict[str, dict[str, float | int | bool | str]] = {}
        """Each actor's memory figures from its latest heartbeat (for summary.json)."""
        self._new_data = trio.Event()

    def grant(self) -> None:
        version = self.version()
        for actor_id, tickets in self.sched.fill(version).items():
            self.guard.issue(actor_id, tickets)
            self.ledger.issued(tickets)
            self.hub.send(self.sched.actors[actor_id].peer, Grant(tickets=tickets))

    async def wait_rollouts(self) -> None:
        """Return once a rollout went into the buffer since the last return (at once if one did)."""
        await self._new_data.wait()
        self._new_data = trio.Event()

    def announce_weights(self, msg: WeightsReady) -> None:
        """Tell every actor of a new weight version (the hub serves its chunks); actors that
        register later get it with their Welcome."""
        self.weights_msg = msg
        for a in self.sched.actors.values():
            self.hub.send(a.peer, msg)

    async def shutdown_actors(self, reason: str) -> None:
        for a in self.sched.actors.values():
            self.hub.send(a.peer, Shutdown(reason=reason))
        await trio.sleep(0.2)  # let ZeroMQ put them on the wire (the socket's LINGER covers the rest)

    # ------------------------------------------------------------------ checkpoint
    def state(self) -> dict[str, object]:
        """What the actor-facing side needs after a resume: the dedupe set, the ticket counter,
        the open tickets and which key owns which actor id."""
        return {
            "seen": self.seen.state(),
            "issued": self.sched.issued,
            "open_tickets": self.guard.state(),
            "owners": dict(self.sched.owners),
        }

    def restore(self, extra: Mapping[str, object], step: int) -> None:
        """Take back ``state()`` from the checkpoint of ``step`` and reopen the tickets it left open."""
        self.seen = SeenSet.load(extra.get("seen", []))
        self.sched.issued = _saved(extra, "issued", int, 0)
        self.seen.start(self.run_id, self.sched.issued)  # this life numbers its tickets on from there
        self.guard.restore(_saved(extra, "open_tickets", list, []))  # their late rollouts still count
        self.sched.owners = dict(_saved(extra, "owners", dict, {}))  # ids stay their keys'
        # Tickets issued but not trained before the checkpoint: buffered groups died with the
        # old learner and actors may be gone too. The journal says which: groups buffered, in
        # flight or trained after this checkpoint are issued again under their old ids (ADR
        # 0010), first; they are the pipeline now, and every other ticket is forfeited (a late
        # rollout of one is still judged).
        reopened = self.ledger.resume(step)
        for t in reopened:
            self.seen.discard(t.group_id)
        self.sched.reissue(reopened, step)
        log.info("tickets_reopened", count=len(reopened), by_reason=dict(self.ledger.lost_in_restart))

    def note_resumed(self, r: Rollout) -> None:
        """Count (and log, with the digest of the handed-over prefix) episodes another actor continued."""
        self.ledger.resumed(r)
        for e in r.episodes:
            if e.resumed_at:
                log.info(
                    "episode_resumed",
                    group=r.group_id,
                    actor_id=r.actor_id,
                    resumed_at=e.resumed_at,
                    tokens=e.num_tokens,
                    prefix=handover_digest(e.token_ids[: 4 * e.resumed_at]),
                )

    def user_id(self) -> str:
        """The CURVE key (ZAP user id) of the connection the message being handled came from."""
        return getattr(getattr(self.hub, "inbox", None), "user_id", "")

    # ------------------------------------------------------------------ control
    def welcome_msg(self, index: int) -> Welcome:
        lc = self.cfg.learner
        return Welcome(
            run_id=self.run_id,
            actor_index=index,
            weights_port=int(lc.bind.rsplit(":", 1)[1]) + 1,
            model_path=str(Path(self.cfg.model.path).resolve()),
            model_fingerprint=self.fingerprint,
            mode=self.cfg.run.mode,
            heartbeat_interval_s=lc.heartbeat_interval_s,
            actor_timeout_s=lc.actor_timeout_s,
            rollout=rollout_spec(self.cfg),
            lora=lora_spec(self.cfg),
        )

    def welcome(self, peer: bytes, msg: Hello) -> None:
        if not msg.model_fingerprint:
            # An actor with no model of its own asks where the learner's is: tell it, register
            # nothing. It checks that path on its host and says Hello again with the fingerprint.
            self.hub.send(peer, self.welcome_msg(0))
            log.info("actor_asked_model", actor_id=msg.actor_id, host=msg.hostname)
            return
        if msg.model_fingerprint != self.fingerprint:
            self.hub.send(
                peer,
                Reject(
                    field="model",
                    reason=(
                        f"actor {msg.actor_id} on {msg.hostname} runs a model with fingerprint {msg.model_fingerprint!r}, "
                        "not the learner's (its log names both); start the actor with the learner's model directory "
                        "(or none: it then uses the learner's path)"
                    ),
                ),
            )
            log.warning(
                "actor_rejected",
                actor=msg.actor_id,
                field="model",
                theirs=msg.model_fingerprint,
                ours=self.fingerprint,
                model=str(self.cfg.model.path),
            )
            return
        conflict = self.sched.identity_conflict(msg.actor_id, self.user_id(), msg.session)
        if conflict is not None:
            # With keys: the id is another key's. Without: another process holds it (live). The
            # Reject reaches the sender only: ZeroMQ routes by the connection that holds the id.
            self.guard.drop(conflict, kind="Hello", actor_id=msg.actor_id, host=msg.hostname, pid=msg.pid)
            self.hub.send(
                peer,
                Reject(
                    field="actor_id",
                    reason=(
                        f"actor id {msg.actor_id!r} belongs to another CURVE key: each key registers its own ids"
                        if conflict == "actor_id_of_another_key"
                        else f"actor id {msg.actor_id!r} is in use by a live actor (another process); start this one "
                        "with another id, or wait until that one leaves or is dropped after learner.actor_timeout_s"
                    ),
                ),
            )
            return
        state, new = self.sched.register(msg.actor_id, peer, msg.hostname, msg.max_groups, msg.session)
        self.hub.send(peer, self.welcome_msg(state.index))
        if self.weights_msg is not None:
            self.hub.send(peer, self.weights_msg)
        # A reconnecting actor re-plays nothing: it re-sends its unacknowledged rollouts, and its
        # outstanding tickets are granted again so it knows they are still its own.
        if state.outstanding:
            self.hub.send(peer, Grant(tickets=list(state.outstanding.values())))
        # Hellos queued while the learner was still binding arrive together: only the first is news.
        level = log.info if new or msg.pid != state.pid else log.debug
        state.pid = msg.pid
        level(
            "actor_joined" if new else "actor_rejoined",
            actor=state.index,
            actor_id=msg.actor_id,
            host=msg.hostname,
            pid=msg.pid,
            max_groups=msg.max_groups,
        )
        self.grant()

    def judge(self, r: Rollout) -> AckStatus:
        """Decide a rollout's fate; everything that arrives is counted under one status."""
        if r.group_id in self.seen:
            return "duplicate"
        self.seen.add(r.group_id)
        version = self.version()
        reason = self.guard.content(r, version)  # vocabulary, budget, masks, versions, finite numbers
        if reason is not None:
            self.guard.reject(reason, r)
            if self.evals.owns(r.group_id):  # its round counts it as played, with no usable episode
                self.evals.record(msgspec.structs.replace(r, episodes=[]))
            return "invalid"
        self.counters.count_breaks(r.episodes)
        if self.evals.owns(r.group_id):
            return "eval"
        usable = trainable_episodes(r)
        self.counters.episodes["env_failure"] += len(r.episodes) - len(usable)
        if not usable:
            return "failed"
        self.mix.add("played", r)
        span = version_span(r, version)
        if self.flight.refused(r.actor_id, *span):  # sampled with weights its engine served wrongly
            self.guard.reject("weights_digest_mismatch", r)
            return "invalid"
        verdict = self.rule.verdict(*span, version)
        if verdict == "accepted":
            return self.filter.judge(usable)
        return verdict

    def on_rollout(self, peer: bytes, r: Rollout) -> None:
        reason = None if r.group_id in self.seen else self.guard.claim(r)
        if reason is not None:
            # Not a ticket this actor holds: touch nothing of the run (no dedupe entry, no ticket
            # released or forfeited), answer invalid so an honest but confused actor forgets it.
            self.guard.reject(reason, r)
            self.counters.groups["invalid"] += 1
            self.counters.episodes["invalid"] += len(r.episodes)
            self.hub.ack(peer, r.group_id, "invalid")
            return
        status = self.judge(r)
        self.ledger.judged(r.group_id, status)
        n_eps = len(r.episodes)
        self.counters.groups[status] += 1
        if status == "accepted":
            self.counters.episodes["accepted"] += len(trainable_episodes(r))
            self.note_resumed(r)  # episodes continued from a hand-over, counted apart
            self.buffer.add(r, *version_span(r, self.version()))
            self._new_data.set()
        elif status == "eval":
            self.counters.episodes["eval"] += n_eps
            self.evals.record(r)
        elif status != "failed":
            self.counters.episodes[status] += n_eps
        if status in ("stale", "invalid", "failed", "filtered"):
            self.sched.forfeit(r.group_id)  # never trained: its place under the admission rule is free
        self.hub.ack(peer, r.group_id, status)
        self.sched.complete(r.actor_id, r.group_id)
        if status not in ("accepted", "eval", "filtered"):
            log.info("rollout_not_accepted", group=r.group_id, status=status, actor_id=r.actor_id)
        self.grant()

    def take_handovers(self, state: ActorState, handovers: list[Handover]) -> int:
        """Put each hand-over of a leaving actor on its ticket (actors/play/handover.py), so the actor
        that gets the ticket next continues those episodes. Only training tickets the actor holds,
        and no more episodes than a group has; the rest is dropped (the group is played again)."""
        taken = 0
        size = self.cfg.rollout.group_size
        for h in handovers:
            t = state.outstanding.get(h.group_id)
            if (
                t is None
                or t.split != "train"
                or h.actor_id != state.actor_id
                or len(h.finished) + len(h.partial) > size
            ):
                self.guard.drop("bad_handover", kind="Leave", actor_id=state.actor_id, group=h.group_id)
                continue
            state.outstanding[h.group_id] = msgspec.structs.replace(t, handover=h)
            self.ledger.handed_over(h)
            taken += 1
            log.info(
                "handover_received",
                group=h.group_id,
                actor_id=state.actor_id,
                finished=len(h.finished),
                partial=len(h.partial),
                prefixes=[handover_digest(p.token_ids) for p in h.partial],
            )
        return taken

    async def control_loop(self) -> None:
        async for peer, msg in self.hub.inbox:
            actor_id = getattr(msg, "actor_id", "")
            if not isinstance(msg, Hello | Heartbeat | Rollout | Leave):
                self.guard.drop("unexpected_kind", kind=type(msg).__name__, peer=peer.hex())
                continue
            if peer != actor_id.encode():
                # An actor's routing id is its actor id (actors/transport.py): a message naming
                # another actor is an impostor's, whatever it asks (Hello would steal the grants).
                self.guard.drop("actor_id_not_sender", kind=type(msg).__name__, actor_id=actor_id, peer=peer.hex())
                continue
            if isinstance(msg, Hello):
                self.welcome(peer, msg)
                continue
            if not self.sched.owned_by(actor_id, self.user_id()):
                # The id was registered by another key: nothing of it is this connection's to touch.
                self.guard.drop("actor_id_of_another_key", kind=type(msg).__name__, actor_id=actor_id)
                continue
            state = self.sched.seen(actor_id)
            if state is None:
                # Unknown actor (e.g. the learner restarted): ask it to say hello again.
                self.guard.drop("unknown_actor", kind=type(msg).__name__, actor_id=actor_id)
                self.hub.send(peer, Heartbeat(weight_version=-1))
                continue
            if isinstance(msg, Rollout):
                self.on_rollout(peer, msg)
            elif isinstance(msg, Heartbeat):
                state.weight_version = msg.weight_version
                if msg.weights_digest >= 0:  # flight recorder: the weights its engine serves
                    self.flight.report(actor_id, msg.weights_version, msg.weights_digest)
                self.sched.set_capacity(actor_id, int(msg.stats.get("capacity", 0)))
                self.actor_memory[actor_id] = {k: v for k, v in msg.stats.items() if k.endswith("_mib")}
            elif isinstance(msg, Leave):
                handed = self.take_handovers(state, msg.handovers)
                back = self.sched.remove(actor_id)
                log.info(
                    "actor_left",
                    actor=state.index,
                    actor_id=actor_id,
                    reason=msg.reason,
                    tickets_returned=len(back),
                    handed_over=handed,
                )
                self.grant()
            else:
                log.warning("unexpected_message", kind=type(msg).__name__, actor=state.index)

    async def reaper(self) -> None:
        lc = self.cfg.learner
        last = trio.current_time()
        while True:
            await trio.sleep(lc.heartbeat_interval_s)
            now = trio.current_time()
            if now - last > max(3 * lc.heartbeat_interval_s, lc.actor_timeout_s / 2):
                # This loop itself was held up (an overloaded host, a long pause): the actors'
                # messages may still be in the inbox, so their silence is not theirs. Start over.
                log.warning("learner_stalled", seconds=round(now - last, 1))
                self.sched.touch_all()
                self.sched.postpone(now - last)  # nor are the deadlines it missed meanwhile
            last = now
            for dead in self.sched.expire(lc.actor_timeout_s):
                log.warning(
                    "actor_lost",
                    actor=dead.index,
                    actor_id=dead.actor_id,
                    silent_s=lc.actor_timeout_s,
                    tickets_returned=len(dead.outstanding),
                )
            for late, ticket in self.sched.overdue():
                # A live heartbeat says nothing of this ticket: another actor plays it too, the
                # first answer is trained and the other is acknowledged duplicate.
                p95 = self.sched.deadlines.turnaround_s(late.actor_id)  # what its deadline was made from
                log.warning(
                    "ticket_overdue",
                    group=ticket.group_id,
                    actor=late.index,
                    actor_id=late.actor_id,
                    turnaround_p95_s=None if p95 is None else round(p95, 2),
                    missed=late.missed,
                    grant=late.earned,
                )
            # The staleness rule's headroom tells actors whether playing more at once would help.
            version = self.version()
            stale = self.counters.groups["stale"] + self.counters.expired["groups"]
            headroom = float(self.sched.headroom(version))
            hint: dict[str, float | int | bool | str] = {"headroom": headroom, "stale_groups": float(stale)}
            for a in self.sched.actors.values():
                self.hub.send(a.peer, Heartbeat(weight_version=version, stats=hint))
            self.serve_leave_requests()
            self.grant()

    def serve_leave_requests(self) -> None:
        """``agentgym actors leave``: ask each named actor to leave as on SIGTERM (it hands its live
        episodes over in its Leave, which returns its tickets); learner/control/requests.py."""
        from agentgym.learner.control.requests import leave_requests

        for actor_id, answer in leave_requests(self.run_dir):
            state = self.sched.actors.get(actor_id)
            if state is None:
                log.warning("leave_request_unknown_actor", actor_id=actor_id, actors=sorted(self.sched.actors))
                answer({"status": "unknown_actor", "actors": sorted(self.sched.actors)})
                continue
            self.hub.send(state.peer, Shutdown(reason="agentgym actors leave", leave=True))
            log.info("actor_asked_to_leave", actor=state.index, actor_id=actor_id, tickets=len(state.outstanding))
            answer({"status": "sent", "tickets": len(state.outstanding)})


T = TypeVar("T")


def _saved(extra: Mapping[str, object], key: str, kind: type[T], default: T) -> T:
    """One field of a checkpoint's service state, of the type it was saved as."""
    value = extra.get(key, default)
    if not isinstance(value, kind):
        raise ValueError(f"checkpoint service state: {key!r} is a {type(value).__name__}, not a {kind.__name__}")
    return value
