"""The learner process: its components wired in one place, all tasks in one trio nursery.

    trio.run(run_learner, cfg, run_dir)

Two components: ``Learner`` (here) trains, ``ActorControl`` (learner/control/actor_control.py) faces the actors.
``Learner.__init__`` builds the parts they share and hands them to ``ActorControl`` (one comment
per part); ``_run_learner`` starts the tasks (one comment per link):
  hub.inbox        -> control_loop   actors' Hello/Heartbeat/Rollout/Leave, read and decoded on the trio thread
                                     (control_loop, reaper and grants: learner/control/actor_control.py)
  control_loop     -> buffer         accepted rollouts (after dedupe, validation and staleness checks)
  buffer           -> train_loop     batch_groups groups per optimizer step (torch runs in a thread)
  train_loop       -> hub            new weight snapshot (pull-served) + WeightsReady to every actor
  scheduler        -> hub            Grants: tickets to actors with free capacity (flow control)
  reaper           -> scheduler      actors silent past actor_timeout_s are dropped, tickets re-issued
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import structlog
import trio

from agentgym.auth.server import ServerKeys
from agentgym.config import Config, to_toml
from agentgym.learner.control.actor_control import ActorControl, version_span
from agentgym.learner.control.bounds import SocketBounds
from agentgym.learner.control.curriculum import Curriculum, success_counts
from agentgym.learner.control.evaluation import EvalRound, Evaluations, env_stats
from agentgym.learner.control.scheduler import Scheduler
from agentgym.learner.control.staleness import StalenessRule, StalenessTally, TrainBuffer
from agentgym.learner.records.accounting import TicketLedger
from agentgym.learner.records.episode_log import EpisodeLog
from agentgym.learner.records.flight_recorder import FlightRecorder, LogprobAgreement
from agentgym.learner.records.flowstats import EpisodeMix, LearnerClock
from agentgym.learner.records.health import RunHealth
from agentgym.learner.records.run_stats import Counters
from agentgym.learner.stopping import StepAbandoned, StopSignals
from agentgym.learner.training.batch import trainable_episodes
from agentgym.learner.training.weight_export import WeightExporter
from agentgym.learner.transport import Hub, WeightSnapshot, open_hub
from agentgym.observe.logs import MetricsWriter
from agentgym.observe.memstats import peak_memory
from agentgym.observe.progress import StepClock
from agentgym.observe.sinks import with_sinks
from agentgym.protocol import WeightsReady
from agentgym.protocol.weights import chunks_digest

if TYPE_CHECKING:
    from agentgym.learner.training.trainer import Trainer  # torch: imported when the learner starts, not here

log = structlog.get_logger(__name__)


class Learner:
    """The learner's training side: it owns the step, the trainer and what a step writes (metrics,
    checkpoints, the curriculum, run health); ``control`` (learner/control/actor_control.py) faces the actors.
    Built by ``_run_learner``; the constructor wires the two, one comment per shared part."""

    def __init__(self, cfg: Config, run_dir: Path, trainer: Trainer, hub: Hub) -> None:
        self.cfg = cfg
        self.run_dir = run_dir
        self.trainer = trainer
        self.hub = hub
        """Serves the weight snapshots (its weights thread); the control side talks to the actors."""
        self.run_id = uuid.uuid4().hex[:8]
        lc = cfg.learner
        self.rule = StalenessRule.from_config(cfg)  # the one owner of the staleness rule
        self.sched = Scheduler(
            envs=cfg.env.specs,
            batch_groups=lc.batch_groups,
            run_id=self.run_id,
            seed=cfg.run.seed,
            rule=self.rule,
            deadline_factor=lc.ticket_deadline_factor,
            deadline_min_s=lc.ticket_deadline_min_s,
            deadline_max_s=lc.ticket_deadline_max_s,
            grant_start=lc.grant_start,
        )
        self.buffer = TrainBuffer(self.rule)
        self.curriculum = Curriculum(cfg.schedule, [e.name for e in cfg.env.specs])
        """Each env's turn limit (learner/control/curriculum.py); checkpointed with the service state."""
        self.clock = LearnerClock()
        self.mix = EpisodeMix()
        self.counters = Counters()
        self.step = 0
        """Steps trained (the trainer's, copied after each step and on restore); ``version`` is it."""
        self.exporter = WeightExporter(cfg.learner.weight_chunk_mib * 1024 * 1024)
        sinks: list[str] = list(cfg.metrics.sinks)  # observe/sinks.py: TensorBoard / W&B beside the JSONL
        self.metrics = with_sinks(MetricsWriter(run_dir / "metrics.jsonl"), sinks, run_dir, "train", cfg=cfg)
        self.eval_metrics = with_sinks(MetricsWriter(run_dir / "eval.jsonl"), sinks, run_dir, "eval", cfg=cfg)
        self.episode_log = EpisodeLog(run_dir / "episodes.jsonl", Path(cfg.model.path), cfg.learner.log_episodes)
        self.evals = Evaluations(cfg, self.sched, self.eval_metrics, self.episode_log)
        """Held-out rounds: tickets through the scheduler, records to eval.jsonl (learner/control/evaluation.py)."""
        self.flight = FlightRecorder(refuse=lc.refuse_digest_mismatch)
        """Weight digests the actors report against the exports' (learner/records/flight_recorder.py)."""
        self.agreement = LogprobAgreement(lc.logprob_outlier_kl)
        """Per actor: its behaviour logprobs against the learner's (learner/records/flight_recorder.py)."""
        self.ledger = TicketLedger(run_dir / "tickets.jsonl")
        """Every training ticket's fate, journaled (learner/records/accounting.py)."""
        self.control = ActorControl(
            cfg,
            hub,  # actors' messages in, Welcome/Grant/Ack/WeightsReady/Heartbeat out
            run_dir=run_dir,  # `agentgym actors leave` requests (learner/control/requests.py)
            run_id=self.run_id,  # Welcome names the run; the dedupe set numbers this life's tickets
            version=lambda: self.version,  # the version rollouts are judged, and tickets granted, against
            sched=self.sched,  # control registers actors and claims tickets; train_loop moves the version on
            rule=self.rule,  # control's staleness verdict on arrival; the buffer's expiry here
            buffer=self.buffer,  # control puts accepted rollouts in; train_loop takes batches out
            ledger=self.ledger,  # control journals issued/judged/handed-over tickets; here trained/expired
            counters=self.counters,  # control counts arrivals by status; here rates and expiries
            mix=self.mix,  # played groups counted there, trained ones here
            evals=self.evals,  # control records eval rollouts; here rounds start and are awaited
            flight=self.flight,  # actors' reported digests there, the exports' here
        )
        """The actor-facing side: registration, grants, judging rollouts, liveness (learner/control/actor_control.py)."""
        self.last_checkpoint = (self.step, time.monotonic())
        self.mid_step = False
        """True while a training step runs: its state is not consistent enough to checkpoint."""
        self.progress = StepClock(cfg.run.max_steps)  # console: step N/total and time left
        self.health = RunHealth(cfg.run.health_window, decode=self.episode_log.decode)
        """No reward signal / collapse warnings (learner/records/health.py); ``collapsed`` ends a run."""
        self.collapsed: str | None = None
        self.staleness = StalenessTally(lc.max_staleness)
        """Trained tokens by staleness over the run (summary.json: is the bound honoured?)."""

    @property
    def version(self) -> int:
        """The weight version being served: weights after ``step`` steps are version ``step``."""
        return self.step

    # ------------------------------------------------------------------ weights
    async def publish(self) -> None:
        """Export the current weights, serve them, and tell every actor."""
        lc = self.cfg.learner
        dtype = self.cfg.model.dtype if lc.weight_dtype == "auto" else lc.weight_dtype
        version = self.version
        # Export and chunk in one thread call: the export may alias live parameters until the
        # chunks have copied them (sources: each tensor writes itself into its chunk, off the GPU
        # in one copy).
        tr = self.trainer
        chunks, chunk_versions = await trio.to_thread.run_sync(
            lambda: self.exporter.build(version, tr.export_weights(dtype, sources=True), tr.trained_names())
        )
        # Flight recorder: what every actor must serve once it has this version (one more crc pass).
        digest, n_tensors = await trio.to_thread.run_sync(chunks_digest, chunks)
        self.flight.exported(version, digest)
        limits = self.curriculum.limits()
        turn_limit = max(limits.values())
        snap = WeightSnapshot.build(self.version, chunks)
        self.hub.publish_weights(snap)
        self.control.announce_weights(
            WeightsReady(
                version=self.version,
                step=self.step,
                turn_limit=turn_limit,
                num_chunks=len(chunks),
                total_bytes=snap.total_bytes,
                chunk_versions=chunk_versions,
                adapter=self.cfg.learner.lora.rank > 0,
                digest=digest,
                tensors=n_tensors,
                # per env only when the envs differ: one limit for all keeps the message as it was
                turn_limits=limits if len(set(limits.values())) > 1 else {},
            )
        )

    # ------------------------------------------------------------------ evaluation
    def start_eval(self) -> EvalRound:
        """Queue an evaluation of the current weights (one per version) and hand its tickets out."""
        rnd = self.evals.start(self.step, self.version)
        self.control.grant()
        return rnd

    # ------------------------------------------------------------------ training
    async def train_loop(self) -> None:
        cfg, lc = self.cfg, self.cfg.learner
        ec = cfg.eval
        self.sched.on_version(self.version)
        # The evaluation at start scores the starting weights exactly (version 0, or the resumed
        # one): actors play it beside the first training groups, and the first step waits for it.
        first = self.start_eval() if ec.at_start else None
        self.control.grant()
        while self.step < cfg.run.max_steps:
            with self.clock.part("wait"):
                self.expire_stale()
                while len(self.buffer) < lc.batch_groups:
                    await self.control.wait_rollouts()
                    self.expire_stale()
                if first is not None:
                    await self.await_eval(first)
                    first = None
            batch = self.buffer.take(lc.batch_groups)
            per_env = env_stats(batch)
            # A signal waits for the step in progress: the learner stops between steps, where a
            # checkpoint is consistent with the ticket journal.
            with trio.CancelScope(shield=True):
                self.mid_step = True
                log.debug("train_step_started", step=self.step + 1, groups=len(batch))
                try:
                    with self.clock.part("train"):
                        stats = await trio.to_thread.run_sync(self.trainer.train_step, batch)
                except StepAbandoned:
                    # A stop signal came before the step's optimizer step: its groups go back to
                    # the buffer (the journal has them buffered, as a resume reopens them).
                    for r in batch:
                        self.buffer.add(r, *version_span(r, self.version))
                    self.mid_step = False
                    log.info("train_step_abandoned", step=self.step + 1, groups=len(batch))
                    return
                group_kl = stats.pop("group_mismatch_kl", None)
                if isinstance(group_kl, list):  # flight recorder: whose logprobs disagree with ours
                    # compared at equal lag: the KL also holds the policy's drift since the group's version
                    self.agreement.observe(
                        self.trainer.step,
                        [
                            (r.actor_id, self.version - version_span(r, self.version)[0], kl)
                            for r, kl in zip(batch, group_kl)
                        ],
                    )
                self.mid_step = False
                self.step = self.trainer.step
                self.ledger.trained([r.group_id for r in batch], self.step)
                # Before publish (version `step` carries the new limits) and before the step's
                # checkpoint (which then holds the state after this step): see learner/control/curriculum.py.
                played = self.curriculum.limits()
                for adv in self.curriculum.observe(self.step, success_counts(per_env)):
                    extra = {} if adv.success is None else {"success": adv.success}
                    log.info(
                        "turn_limit_advanced",
                        env=adv.env,
                        from_limit=adv.from_limit,
                        to_limit=adv.to_limit,
                        step=adv.step,
                        reason=adv.reason,
                        **extra,
                    )
            for r in batch:
                self.mix.add("trained", r)
            verdict = self.health.observe(self.step, batch, stats.get("entropy", 0.0), stats.get("advantage_abs_mean"))
            stats.update(self.health.metrics())
            self.staleness.add(stats)
            stats = {**stats, **per_env, **self.mix.step_record(), **self.curriculum.metrics(played)}
            try:
                with self.clock.part("export"):
                    await self.publish()
                self.sched.on_version(self.version)
                self.control.grant()
            finally:  # a stop during the publish: the step is trained and checkpointed, so it is recorded
                with trio.CancelScope(shield=True):
                    self.report({**stats, **self.clock.step_record()})
                    await trio.to_thread.run_sync(self.episode_log.write, "train", self.step, self.version, batch)
            if (lc.checkpoint_every and self.step % lc.checkpoint_every == 0) or (
                lc.checkpoint_minutes and time.monotonic() - self.last_checkpoint[1] >= 60 * lc.checkpoint_minutes
            ):
                await self.checkpoint()
            if ec.every and self.step % ec.every == 0:
                self.start_eval()
            if verdict is not None and cfg.run.stop_on_collapse:
                self.collapsed = verdict.reason
                break
        await self.checkpoint("end")
        if ec.at_end:
            await self.await_eval(self.start_eval())

    async def await_eval(self, rnd: EvalRound) -> None:
        """Wait for an evaluation round, at most ``eval.end_timeout_s``; then go on without it."""
        timeout = self.cfg.eval.end_timeout_s
        with trio.move_on_after(timeout):
            await rnd.done.wait()
        if not rnd.done.is_set():
            log.warning("eval_incomplete", version=rnd.version, groups_missing=len(rnd.pending), timeout_s=timeout)

    def expire_stale(self) -> None:
        """Drop buffered groups with nothing trainable left (the staleness rule says which).

        Trained earliest-deadline-first, a group expires only when steps were trained while it
        waited and even its newest tokens are now past the bound; removing it lets a fresher
        group take its place in the batch.
        """
        dead = self.buffer.expire(self.version)
        for r in dead:
            self.counters.expired["groups"] += 1
            self.counters.expired["episodes"] += len(trainable_episodes(r))
            self.ledger.expired(r.group_id)
            self.sched.forfeit(r.group_id)
            log.info(
                "rollout_expired",
                group=r.group_id,
                actor_id=r.actor_id,
                version=self.version,
                span=list(version_span(r, self.version)),
            )
        if dead:
            self.control.grant()  # their places under the admission rule are free: hand them out now

    def report(self, stats: dict[str, float]) -> None:
        rec = {
            "step": self.step,
            "version": self.version,
            **self.counters.rates(int(stats["agent_tokens"])),
            "actors": len(self.sched.actors),
            "buffered_groups": len(self.buffer),
            "tickets_in_flight": self.sched.in_flight,
            "tickets_deadline_reissued": self.sched.deadline_reissued,
            "late_answers": self.sched.late_answers,
            **self.counters.step_fields(),
            **self.control.guard.metrics(),
            **self.flight.metrics(),
            **self.agreement.metrics(),
            **stats,
            **peak_memory(),
        }
        self.metrics.write(rec)
        log.info(
            # The console speaks metrics.jsonl's names, so a value seen here is found there.
            "step",
            step=self.step,
            version=self.version,
            reward_mean=round(stats["reward_mean"], 3),
            success_rate=round(stats["success_rate"], 3),
            trajectories_per_s=round(rec["trajectories_per_s"], 1),
            tokens_per_s=round(rec["tokens_per_s"], 1),
            staleness_mean=round(stats["staleness_mean"], 2),
            turn_limit=int(rec["turn_limit"]),
            loss=round(stats["loss"], 4),
            actors=rec["actors"],
            **self.progress.fields(self.step),
            **(
                {
                    "success_by_env": {
                        e.name: round(stats[f"env/{e.name}/success_rate"], 3)
                        for e in self.cfg.env.specs
                        if f"env/{e.name}/success_rate" in stats
                    }
                }
                if len(self.cfg.env.specs) > 1
                else {}
            ),
        )

    async def checkpoint(self, reason: str = "periodic") -> None:
        if self.mid_step or self.last_checkpoint[0] == self.step:
            return  # half a step is not a state to resume from; an unchanged one is saved already
        path = self.run_dir / "checkpoints" / f"step_{self.step:06d}"
        await trio.to_thread.run_sync(self.trainer.save, path, self.checkpoint_state())
        self.last_checkpoint = (self.step, time.monotonic())
        log.info("checkpoint_saved", step=self.step, path=str(path), reason=reason)
        # The journal keeps what a resume from any checkpoint still kept needs, the rest as counts.
        kept = [int(p.name.split("_")[1]) for p in path.parent.glob("step_*") if p.name.split("_")[1].isdigit()]
        folded = self.ledger.compact(min(kept, default=self.step))
        if folded:
            log.debug(
                "ticket_journal_compacted", folded=folded, open=len(self.ledger.tickets), keep_from_step=min(kept)
            )

    def checkpoint_state(self) -> dict[str, object]:
        """What the service needs after a resume (step and version come from the trainer's step):
        the control side's (dedupe set, ticket counter, open tickets) and the turn-limit curriculum."""
        return {**self.control.state(), "curriculum": self.curriculum.state()}

    def restore(self, extra: dict[str, object]) -> None:
        self.step = self.trainer.step
        curriculum = extra.get("curriculum")
        if curriculum is not None and not isinstance(curriculum, dict):
            raise ValueError(f"checkpoint service state: 'curriculum' is a {type(curriculum).__name__}, not a dict")
        fresh = self.curriculum.restore(curriculum, self.step)
        if fresh:
            log.warning("curriculum_state_missing", envs=fresh, step=self.step, stage=0)
        self.control.restore(extra, self.step)
        self.last_checkpoint = (self.step, time.monotonic())

    def finish(self, reason: str) -> None:
        """Close the run's logs and write summary.json: what the run did, counted."""
        self.metrics.close()
        self.eval_metrics.close()
        self.episode_log.close()
        c = self.counters
        in_flight = [g for a in self.sched.actors.values() for g in a.outstanding]
        in_flight += [t.group_id for t in self.sched.requeue]
        tickets = self.ledger.summary([r.group_id for r in self.buffer], in_flight)
        # Issued again past a deadline (events, also in ``reissued``) and the answers that then came second.
        tickets.update(deadline_reissued=self.sched.deadline_reissued, late_answers=self.sched.late_answers)
        self.ledger.close()
        hub = self.hub
        log.info(
            "learner_finished",
            reason=reason,
            step=self.step,
            groups=c.groups,
            episodes=c.episodes,
            expired=c.expired,
            bad_messages=hub.bad_messages,
            weight_chunks_served=hub.weight_chunks_served,
        )
        (self.run_dir / "summary.json").write_text(
            json.dumps(
                {
                    "reason": reason,
                    "step": self.step,
                    "version": self.version,
                    "groups": c.groups,
                    "episodes": c.episodes,
                    "expired": c.expired,
                    "bad_messages": hub.bad_messages,
                    "prefix_breaks": c.prefix_breaks,
                    "invalid_reasons": dict(self.control.guard.invalid),
                    "dropped_messages": dict(self.control.guard.dropped),
                    "auth_refused": hub.allow.refused if hub.allow else 0,
                    "weights_served": {"chunks": hub.weight_chunks_served, "bytes": hub.weight_bytes_served},
                    "sends_dropped": {"control": hub.inbox.sends_dropped, "weights": hub.weight_replies_dropped},
                    "tickets": tickets,
                    "eval": [{k: v for k, v in e.items() if not k.startswith("env/")} for e in self.evals.results],
                    "learner_time": self.clock.summary(),
                    "episode_mix": self.mix.summary(),
                    "learner_memory": peak_memory(),
                    "actor_memory": self.control.actor_memory,
                    "flight_recorder": {**self.flight.summary(), "logprob_agreement": self.agreement.summary()},
                    "health": self.health.summary(),
                    "trained_staleness": self.staleness.summary(),
                },
                indent=2,
            )
        )


async def run_learner(cfg: Config, run_dir: Path, resume: bool = False) -> int:
    """The learner's life. One signal receiver spans all of it, from loading the model to the last
    line of summary.json: the first SIGINT or SIGTERM stops the run, later ones change nothing
    (learner/stopping.py)."""
    from agentgym.host import early_signals

    stop = StopSignals()
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as outer:
            outer.start_soon(stop.watch, signals)
            while (held := early_signals.take()) is not None:  # came before the receiver opened
                stop.got(held)
            code = await _run_learner(cfg, run_dir, resume, stop)
            outer.cancel_scope.cancel()
    return code


async def _run_learner(cfg: Config, run_dir: Path, resume: bool, stop: StopSignals) -> int:
    from agentgym.learner.training.checkpoint import latest_checkpoint
    from agentgym.learner.training.trainer import Trainer

    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.toml").write_text(to_toml(cfg))
    log.info("learner_starting", run_dir=str(run_dir), model=str(cfg.model.path), mode=cfg.run.mode, pid=os.getpid())
    trainer = await trio.to_thread.run_sync(Trainer.load, cfg)
    token = trio.lowlevel.current_trio_token()

    def rank_stop(reason: str) -> None:  # a rank > 0 got a stop signal (learner/training/distributed.py)
        m = re.fullmatch(r"learner rank (\d+) got (\w+)", reason)
        fields = {"rank": int(m[1]), "signal": m[2]} if m else {"request": reason}
        try:
            trio.from_thread.run_sync(lambda: stop.request(reason, **fields), trio_token=token)
        except trio.RunFinishedError:
            pass

    trainer.dp.watch_stop_requests(rank_stop)
    extra: dict[str, object] | None = None
    if resume:
        ckpt = latest_checkpoint(run_dir / "checkpoints")
        if ckpt is None:
            raise FileNotFoundError(f"--resume {run_dir}: no complete checkpoint under {run_dir / 'checkpoints'}")
        extra = await trio.to_thread.run_sync(trainer.load_checkpoint, ckpt)
        log.info("learner_resumed", checkpoint=str(ckpt), step=trainer.step, version=trainer.version)
    lc = cfg.learner
    bounds = SocketBounds.from_config(cfg)  # frame caps and receive queue from the run's limits
    async with open_hub(
        lc.bind,
        keys=ServerKeys.load(lc.secret_key, lc.authorized_keys),
        insecure=lc.insecure,
        max_msg_bytes=bounds.control_frame,
        weights_max_bytes=bounds.weights_frame,
        inbox_size=bounds.inbox_messages,
        peer_timeout_s=lc.actor_timeout_s,
    ) as hub:
        learner = Learner(cfg, run_dir, trainer, hub)
        if extra is not None:
            learner.restore(extra)
        log.info("learner_listening", bind=cfg.learner.bind, run_id=learner.run_id)
        reason = "run finished"
        async with trio.open_nursery() as nursery:
            stop.attach(nursery.cancel_scope, getattr(trainer, "abandon", None), lambda: learner.mid_step)
            await learner.publish()  # version 0: the weights actors start from
            nursery.start_soon(learner.control.control_loop)  # hub.inbox -> control_loop -> buffer, grants
            nursery.start_soon(learner.control.reaper)  # liveness both ways; re-issue lost tickets
            try:
                await learner.train_loop()  # buffer -> torch step -> publish weights -> grants
            except Exception:
                # A failure outside a training step leaves a consistent state: keep it.
                log.exception("train_loop_failed", step=learner.step, checkpoint=not learner.mid_step)
                with trio.CancelScope(shield=True):
                    await learner.checkpoint("crash")
                raise
            nursery.cancel_scope.cancel()
        stop.attach(trio.CancelScope(), None)  # the run is over: a signal from here on is only noted
        if stop.reason is not None:
            reason = stop.reason
        if learner.collapsed:
            reason = learner.collapsed
        if reason != "run finished":
            with trio.CancelScope(shield=True):
                await learner.checkpoint("interrupted")  # resume with --resume
        with trio.CancelScope(shield=True), trio.move_on_after(10):
            await learner.control.shutdown_actors(reason)
        learner.finish(reason)  # summary.json
    await trio.to_thread.run_sync(trainer.close)  # stops the other data-parallel ranks
    if learner.collapsed:
        log.error("learner_stopped", reason=learner.collapsed)
        return 3
    return 0 if reason == "run finished" else 130
