"""The learner process: its components wired in one place, all tasks in one trio nursery.

    trio.run(run_learner, cfg, run_dir)

Links (one comment each where they are made in ``run_learner``):
  hub.inbox        -> control_loop   actors' Hello/Heartbeat/Rollout/Leave, decoded in the I/O thread
  control_loop     -> buffer         accepted rollouts (after dedupe, validation and staleness checks)
  buffer           -> train_loop     batch_groups groups per optimizer step (torch runs in a thread)
  train_loop       -> hub            new weight snapshot (pull-served) + WeightsReady to every actor
  scheduler        -> hub            Grants: tickets to actors with free capacity (flow control)
  reaper           -> scheduler      actors silent past actor_timeout_s are dropped, tickets re-issued
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import structlog
import trio

from agentgym.config import Config, model_fingerprint, to_toml
from agentgym.learner.batch import trainable_episodes
from agentgym.learner.episode_log import EpisodeLog
from agentgym.learner.scheduler import Scheduler
from agentgym.learner.transport import Hub, WeightSnapshot, open_hub
from agentgym.logs import MetricsWriter
from agentgym.protocol import (
    Ack,
    AckStatus,
    CriticSpec,
    Grant,
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
from agentgym.protocol.weights import make_chunks

log = structlog.get_logger(__name__)

RATE_WINDOW_S = 10.0


def rollout_spec(cfg: Config) -> RolloutSpec:
    """How actors play, from the learner's config: what every Welcome carries."""
    rc = cfg.rollout
    return RolloutSpec(
        group_size=rc.group_size, max_tokens_per_turn=rc.max_tokens_per_turn, max_episode_tokens=rc.max_episode_tokens,
        temperature=rc.temperature, top_p=rc.top_p, env_kwargs={e.name: dict(e.kwargs) for e in cfg.env.specs},
        system_prompt=rc.system_prompt,
        critic=CriticSpec(**cfg.critic.model_dump(exclude={"enabled"})) if cfg.critic.enabled else None,
    )  # fmt: skip


def env_stats(batch: list[Rollout]) -> dict[str, float]:
    """Per-environment numbers of a training batch, as flat ``env/<name>/<metric>`` keys: episodes,
    mean reward, success rate, mean agent turns, and the share of episodes cut by the turn limit."""
    by_env: dict[str, list] = {}
    for r in batch:
        by_env.setdefault(r.env, []).extend(trainable_episodes(r))
    out: dict[str, float] = {}
    for name, eps in sorted(by_env.items()):
        n = max(len(eps), 1)
        out[f"env/{name}/episodes"] = float(len(eps))
        out[f"env/{name}/reward_mean"] = sum(e.reward for e in eps) / n
        out[f"env/{name}/success_rate"] = sum(e.success for e in eps) / n
        out[f"env/{name}/turns_mean"] = sum(unpack(e.turn_ends, I32).size for e in eps) / n
        out[f"env/{name}/truncated_rate"] = sum(e.finish == "turn_limit" for e in eps) / n
    return out


@dataclass
class Counters:
    groups: dict[str, int] = field(default_factory=lambda: dict.fromkeys(("accepted", "stale", "duplicate", "invalid", "failed", "eval"), 0))
    episodes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(("accepted", "stale", "duplicate", "invalid", "failed", "eval", "env_failure"), 0))
    agent_tokens: int = 0
    expired: dict[str, int] = field(default_factory=lambda: {"groups": 0, "episodes": 0})
    """Accepted groups that aged past max_staleness in the buffer and were dropped untrained
    (a subset of ``groups["accepted"]``: the ack had already said accepted)."""


def oldest_version(r: Rollout, default: int) -> int:
    """The oldest weight version behind any agent token of the group's usable episodes."""
    return min(
        (int(unpack(e.versions, I32)[unpack(e.loss_mask, U8) > 0].min(initial=default)) for e in trainable_episodes(r)),
        default=default,
    )


@dataclass
class EvalRound:
    """One evaluation: its groups in flight and those back."""

    step: int
    version: int
    pending: set[str]
    rollouts: list[Rollout] = field(default_factory=list)
    done: trio.Event = field(default_factory=trio.Event)
    started: float = field(default_factory=time.monotonic)


class Learner:
    def __init__(self, cfg: Config, run_dir: Path, trainer: object, hub: Hub) -> None:
        self.cfg = cfg
        self.run_dir = run_dir
        self.trainer = trainer
        self.hub = hub
        self.run_id = uuid.uuid4().hex[:8]
        self.fingerprint = model_fingerprint(cfg.model.path)
        lc = cfg.learner
        self.sched = Scheduler(
            envs=cfg.env.specs,
            batch_groups=lc.batch_groups,
            max_staleness=lc.max_staleness,
            mode=cfg.run.mode,
            run_id=self.run_id,
            seed=cfg.run.seed,
        )
        self.buffer: list[Rollout] = []
        self.seen: set[str] = set()
        self.counters = Counters()
        self.new_data = trio.Event()
        self.version = 0
        self.step = 0
        self.weights_msg: WeightsReady | None = None
        self.metrics = MetricsWriter(run_dir / "metrics.jsonl")
        self.eval_metrics = MetricsWriter(run_dir / "eval.jsonl")
        self.episode_log = EpisodeLog(run_dir / "episodes.jsonl", Path(cfg.model.path), cfg.learner.log_episodes)
        self.evals: dict[str, EvalRound] = {}
        """Evaluation groups in flight -> their round."""
        self.eval_by_version: dict[int, EvalRound] = {}
        self.eval_results: list[dict[str, object]] = []
        self._rate_window: deque[tuple[float, int, int]] = deque([(time.monotonic(), 0, 0)])
        """(time, accepted episodes, agent tokens) of recent steps: rates over the last ~10 s."""

    # ------------------------------------------------------------------ weights
    async def publish(self) -> None:
        """Export the current weights, serve them, and tell every actor."""
        lc = self.cfg.learner
        tensors = await trio.to_thread.run_sync(self.trainer.export_weights)
        chunks = make_chunks(self.version, tensors, lc.weight_chunk_mib * 1024 * 1024)
        turn_limit = self.cfg.schedule.turn_limit(self.step)
        snap = WeightSnapshot.build(self.version, self.step, turn_limit, chunks)
        self.hub.publish_weights(snap)
        self.weights_msg = WeightsReady(
            version=self.version, step=self.step, turn_limit=turn_limit,
            num_chunks=len(chunks), total_bytes=snap.total_bytes,
        )  # fmt: skip
        for a in self.sched.actors.values():
            self.hub.send(a.peer, self.weights_msg)

    def grant(self) -> None:
        for actor_id, tickets in self.sched.fill(self.version).items():
            self.hub.send(self.sched.actors[actor_id].peer, Grant(tickets=tickets))

    # ------------------------------------------------------------------ control
    def welcome(self, peer: bytes, msg: Hello) -> None:
        if msg.model_fingerprint != self.fingerprint:
            self.hub.send(peer, Reject(field="model", reason=(
                f"actor {msg.actor_id} on {msg.hostname} runs a model with fingerprint {msg.model_fingerprint}, "
                f"the learner trains {self.cfg.model.path} (fingerprint {self.fingerprint}); "
                "start the actor with the same model directory (or none: it then uses the learner's path)"
            )))  # fmt: skip
            log.warning("actor_rejected", actor=msg.actor_id, field="model")
            return
        state, new = self.sched.register(msg.actor_id, peer, msg.hostname, msg.max_groups)
        lc = self.cfg.learner
        self.hub.send(peer, Welcome(
            run_id=self.run_id, actor_index=state.index,
            weights_port=int(lc.bind.rsplit(":", 1)[1]) + 1,
            model_path=str(Path(self.cfg.model.path).resolve()), model_fingerprint=self.fingerprint,
            mode=self.cfg.run.mode, heartbeat_interval_s=lc.heartbeat_interval_s,
            actor_timeout_s=lc.actor_timeout_s,
            rollout=rollout_spec(self.cfg),
        ))  # fmt: skip
        if self.weights_msg is not None:
            self.hub.send(peer, self.weights_msg)
        # A reconnecting actor re-plays nothing: it re-sends its unacknowledged rollouts, and its
        # outstanding tickets are granted again so it knows they are still its own.
        if state.outstanding:
            self.hub.send(peer, Grant(tickets=list(state.outstanding.values())))
        # Hellos queued while the learner was still binding arrive together: only the first is news.
        level = log.info if new or msg.pid != state.pid else log.debug
        state.pid = msg.pid
        level("actor_joined" if new else "actor_rejoined", actor=state.index, actor_id=msg.actor_id,
              host=msg.hostname, pid=msg.pid, max_groups=msg.max_groups)  # fmt: skip
        self.grant()

    def judge(self, r: Rollout) -> AckStatus:
        """Decide a rollout's fate; everything that arrives is counted under one status."""
        if r.group_id in self.seen:
            return "duplicate"
        self.seen.add(r.group_id)
        if r.group_id in self.evals:
            return "eval"
        if len(r.episodes) != self.cfg.rollout.group_size:
            log.warning("rollout_invalid", group=r.group_id, episodes=len(r.episodes),
                        group_size=self.cfg.rollout.group_size)  # fmt: skip
            return "invalid"
        usable = trainable_episodes(r)
        self.counters.episodes["env_failure"] += len(r.episodes) - len(usable)
        if not usable:
            return "failed"
        oldest = oldest_version(r, self.version)
        newest = max(int(unpack(e.versions, I32).max(initial=-1)) for e in usable)
        if newest > self.version:
            # Weights this learner never had (it resumed from an earlier checkpoint than the
            # actor's weights): staleness would be negative, so the group is not trainable.
            return "stale"
        if self.cfg.run.mode == "sync":
            return "accepted" if oldest >= self.version else "stale"
        if self.version - oldest > self.cfg.learner.max_staleness and self.cfg.learner.staleness_mode == "drop":
            return "stale"
        return "accepted"

    def on_rollout(self, peer: bytes, r: Rollout) -> None:
        status = self.judge(r)
        n_eps = len(r.episodes)
        self.counters.groups[status] += 1
        if status == "accepted":
            self.counters.episodes["accepted"] += len(trainable_episodes(r))
            self.buffer.append(r)
            self.new_data.set()
        elif status == "eval":
            self.counters.episodes["eval"] += n_eps
            self.on_eval(r)
        elif status != "failed":
            self.counters.episodes[status] += n_eps
        if status in ("stale", "invalid", "failed"):
            self.sched.forfeit(r.group_id)  # never trained: its place under the admission rule is free
        self.hub.send(peer, Ack(group_ids=[r.group_id], statuses=[status]))
        self.sched.complete(r.actor_id, r.group_id)
        if status not in ("accepted", "eval"):
            log.info("rollout_not_accepted", group=r.group_id, status=status, actor_id=r.actor_id)
        self.grant()

    async def control_loop(self) -> None:
        async for peer, msg in self.hub.inbox:
            if isinstance(msg, Hello):
                self.welcome(peer, msg)
                continue
            actor_id = getattr(msg, "actor_id", "")
            state = self.sched.seen(actor_id)
            if state is None:
                # Unknown actor (e.g. the learner restarted): ask it to say hello again.
                log.info("unknown_actor_message", kind=type(msg).__name__, actor_id=actor_id)
                self.hub.send(peer, Heartbeat(weight_version=-1))
                continue
            if isinstance(msg, Rollout):
                self.on_rollout(peer, msg)
            elif isinstance(msg, Heartbeat):
                state.weight_version = msg.weight_version
            elif isinstance(msg, Leave):
                back = self.sched.remove(actor_id)
                log.info("actor_left", actor=state.index, reason=msg.reason, tickets_returned=len(back))
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
            last = now
            for dead in self.sched.expire(lc.actor_timeout_s):
                log.warning("actor_lost", actor=dead.index, actor_id=dead.actor_id,
                            silent_s=lc.actor_timeout_s, tickets_returned=len(dead.outstanding))  # fmt: skip
            for a in self.sched.actors.values():
                self.hub.send(a.peer, Heartbeat(weight_version=self.version))
            self.grant()

    # ------------------------------------------------------------------ evaluation
    def start_eval(self) -> EvalRound:
        """Queue an evaluation of the current weights (one per version)."""
        known = self.eval_by_version.get(self.version)
        if known is not None:
            return known
        ec = self.cfg.eval
        tickets = self.sched.eval_round(self.version, ec.split, ec.tasks)
        rnd = EvalRound(self.step, self.version, {t.group_id for t in tickets})
        self.eval_by_version[self.version] = rnd
        for t in tickets:
            self.evals[t.group_id] = rnd
        log.info("eval_started", step=self.step, version=self.version, split=ec.split, groups=len(tickets))
        self.grant()
        return rnd

    def on_eval(self, r: Rollout) -> None:
        rnd = self.evals.pop(r.group_id)
        rnd.pending.discard(r.group_id)
        rnd.rollouts.append(r)
        if rnd.pending:
            return
        eps = [e for x in rnd.rollouts for e in trainable_episodes(x)]
        n = max(len(eps), 1)
        versions = [unpack(e.versions, I32)[unpack(e.loss_mask, U8) > 0] for e in eps]
        used = [int(v.min()) for v in versions if v.size] + [int(v.max()) for v in versions if v.size]
        rec: dict[str, object] = {
            "step": rnd.step, "version": rnd.version, "split": self.cfg.eval.split,
            "episodes": len(eps), "success_rate": sum(e.success for e in eps) / n,
            "reward_mean": sum(e.reward for e in eps) / n,
            "env_failures": sum(len(x.episodes) for x in rnd.rollouts) - len(eps),
            "versions_used": [min(used, default=-1), max(used, default=-1)],
            "seconds": time.monotonic() - rnd.started,
            **env_stats(rnd.rollouts),
        }  # fmt: skip
        self.eval_metrics.write(rec)
        self.episode_log.write("eval", rnd.step, rnd.version, rnd.rollouts)
        self.eval_results.append(rec)
        log.info("eval", step=rnd.step, version=rnd.version, split=rec["split"], episodes=len(eps),
                 success=round(float(rec["success_rate"]), 3), reward=round(float(rec["reward_mean"]), 3),
                 seconds=round(float(rec["seconds"]), 1))  # fmt: skip
        rnd.done.set()

    # ------------------------------------------------------------------ training
    async def train_loop(self) -> None:
        cfg, lc = self.cfg, self.cfg.learner
        ec = cfg.eval
        if cfg.run.mode == "sync":
            self.sched.open_sync_round(self.version)
        if ec.at_start:
            self.start_eval()
        self.grant()
        while self.step < cfg.run.max_steps:
            self.expire_stale()
            while len(self.buffer) < lc.batch_groups:
                await self.new_data.wait()
                self.new_data = trio.Event()
            batch, self.buffer = self.buffer[: lc.batch_groups], self.buffer[lc.batch_groups :]
            per_env = env_stats(batch)
            stats = await trio.to_thread.run_sync(self.trainer.train_step, batch)
            stats = {**stats, **per_env}
            self.step, self.version = self.trainer.step, self.trainer.version
            await self.publish()
            if cfg.run.mode == "sync":
                self.sched.open_sync_round(self.version)
            self.grant()
            self.report(stats)
            await trio.to_thread.run_sync(self.episode_log.write, "train", self.step, self.version, batch)
            if lc.checkpoint_every and self.step % lc.checkpoint_every == 0:
                await self.checkpoint()
            if ec.every and self.step % ec.every == 0:
                self.start_eval()
        await self.checkpoint()
        if ec.at_end:
            rnd = self.start_eval()
            with trio.move_on_after(ec.end_timeout_s):
                await rnd.done.wait()
            if not rnd.done.is_set():
                log.warning("eval_incomplete", version=rnd.version, groups_missing=len(rnd.pending),
                            timeout_s=ec.end_timeout_s)  # fmt: skip

    def expire_stale(self) -> None:
        """Drop buffered groups that aged past ``max_staleness`` while waiting to be trained.

        A group is admitted when its oldest token is at most K versions old, but steps can be
        trained while it sits in the buffer. In "drop" mode the trainer would give its tokens
        weight 0 anyway; removing it lets a fresher group take its place in the batch.
        """
        lc = self.cfg.learner
        if lc.staleness_mode != "drop" or self.cfg.run.mode == "sync":
            return
        keep = []
        for r in self.buffer:
            oldest = oldest_version(r, self.version)
            if self.version - oldest > lc.max_staleness:
                self.counters.expired["groups"] += 1
                self.counters.expired["episodes"] += len(trainable_episodes(r))
                self.sched.forfeit(r.group_id)
                log.info("rollout_expired", group=r.group_id, actor_id=r.actor_id, version=self.version, oldest=oldest)
            else:
                keep.append(r)
        if len(keep) < len(self.buffer):
            self.buffer = keep
            self.grant()  # their places under the admission rule are free: hand them out now

    def report(self, stats: dict[str, float]) -> None:
        now = time.monotonic()
        self.counters.agent_tokens += int(stats["agent_tokens"])
        eps, toks = self.counters.episodes["accepted"], self.counters.agent_tokens
        # Rates over a window of recent steps, not the last step alone: several steps can be
        # trained back to back from a full buffer, with no new episodes in between.
        while len(self._rate_window) > 1 and now - self._rate_window[1][0] >= RATE_WINDOW_S:
            self._rate_window.popleft()
        t0, eps0, toks0 = self._rate_window[0]
        dt = max(now - t0, 1e-9)
        self._rate_window.append((now, eps, toks))
        rec = {
            "step": self.step, "version": self.version,
            "turn_limit": self.cfg.schedule.turn_limit(self.step - 1),
            "trajectories_per_s": (eps - eps0) / dt,
            "tokens_per_s": (toks - toks0) / dt,
            "actors": len(self.sched.actors), "buffered_groups": len(self.buffer),
            "tickets_in_flight": self.sched.in_flight,
            **{f"groups_{k}": v for k, v in self.counters.groups.items()},
            **{f"episodes_{k}": v for k, v in self.counters.episodes.items()},
            "groups_expired": self.counters.expired["groups"],
            **stats,
        }  # fmt: skip
        self.metrics.write(rec)
        log.info(
            "step", step=self.step, version=self.version, reward=round(stats["reward_mean"], 3),
            success=round(stats["success_rate"], 3), traj_per_s=round(rec["trajectories_per_s"], 1),
            tok_per_s=round(rec["tokens_per_s"], 1), staleness=round(stats["staleness_mean"], 2),
            turn_limit=rec["turn_limit"], loss=round(stats["loss"], 4), actors=rec["actors"],
            **({"success_by_env": {e.name: round(stats[f"env/{e.name}/success_rate"], 3)
                                   for e in self.cfg.env.specs if f"env/{e.name}/success_rate" in stats}}
               if len(self.cfg.env.specs) > 1 else {}),
        )  # fmt: skip

    async def checkpoint(self) -> None:
        path = self.run_dir / "checkpoints" / f"step_{self.step:06d}"
        await trio.to_thread.run_sync(self.trainer.save, path, self.checkpoint_state())
        log.info("checkpoint_saved", step=self.step, path=str(path))

    def checkpoint_state(self) -> dict[str, object]:
        """What the service needs after a resume (step, version and the turn-limit stage come
        from the trainer's step): the dedupe set and the ticket counter."""
        return {"seen": sorted(self.seen), "issued": self.sched.issued}

    def restore(self, extra: dict[str, object]) -> None:
        self.step, self.version = self.trainer.step, self.trainer.version
        self.seen = set(extra.get("seen", []))  # type: ignore[arg-type]
        self.sched.issued = int(extra.get("issued", 0))  # type: ignore[arg-type]
        # Tickets issued but not trained before the checkpoint: buffered groups died with the
        # old learner and actors may be gone too. Count them all as forfeited so the admission
        # rule starts with a full pipeline (a late rollout of one of them is still judged).
        self.sched.forfeited = max(0, self.sched.issued - self.cfg.learner.batch_groups * self.step)

    async def shutdown_actors(self, reason: str) -> None:
        for a in self.sched.actors.values():
            self.hub.send(a.peer, Shutdown(reason=reason))
        await trio.sleep(0.2)  # let the I/O thread flush before the sockets close


async def run_learner(cfg: Config, run_dir: Path, resume: bool = False) -> int:
    from agentgym.learner.checkpoint import latest_checkpoint
    from agentgym.learner.trainer import Trainer

    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.toml").write_text(to_toml(cfg))
    log.info("learner_starting", run_dir=str(run_dir), model=str(cfg.model.path), mode=cfg.run.mode, pid=os.getpid())
    trainer = await trio.to_thread.run_sync(Trainer.load, cfg)
    extra: dict[str, object] | None = None
    if resume:
        ckpt = latest_checkpoint(run_dir / "checkpoints")
        if ckpt is None:
            raise FileNotFoundError(f"--resume {run_dir}: no complete checkpoint under {run_dir / 'checkpoints'}")
        extra = await trio.to_thread.run_sync(trainer.load_checkpoint, ckpt)
        log.info("learner_resumed", checkpoint=str(ckpt), step=trainer.step, version=trainer.version)
    async with open_hub(cfg.learner.bind) as hub:
        learner = Learner(cfg, run_dir, trainer, hub)
        if extra is not None:
            learner.restore(extra)
        log.info("learner_listening", bind=cfg.learner.bind, run_id=learner.run_id)
        reason = "run finished"
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:
                await learner.publish()  # version 0: the weights actors start from
                nursery.start_soon(learner.control_loop)  # hub.inbox -> control_loop -> buffer, grants
                nursery.start_soon(learner.reaper)  # liveness both ways; re-issue lost tickets

                async def watch_signals() -> None:
                    nonlocal reason
                    async for sig in signals:
                        reason = f"learner got {signal.Signals(sig).name}"
                        log.warning("learner_interrupted", signal=signal.Signals(sig).name)
                        nursery.cancel_scope.cancel()
                        return

                nursery.start_soon(watch_signals)
                await learner.train_loop()  # buffer -> torch step -> publish weights -> grants
                nursery.cancel_scope.cancel()
        with trio.CancelScope(shield=True), trio.move_on_after(10):
            await learner.shutdown_actors(reason)
        learner.metrics.close()
        learner.eval_metrics.close()
        learner.episode_log.close()
        c = learner.counters
        log.info("learner_finished", reason=reason, step=learner.step, groups=c.groups, episodes=c.episodes,
                 expired=c.expired, bad_messages=hub.bad_messages, weight_chunks_served=hub.weight_chunks_served)  # fmt: skip
        (run_dir / "summary.json").write_text(__import__("json").dumps({
            "reason": reason, "step": learner.step, "version": learner.version,
            "groups": c.groups, "episodes": c.episodes, "expired": c.expired, "bad_messages": hub.bad_messages,
            "eval": [{k: v for k, v in e.items() if not k.startswith("env/")} for e in learner.eval_results],
        }, indent=2))  # fmt: skip
    await trio.to_thread.run_sync(trainer.close)  # stops the other data-parallel ranks
    return 0 if reason == "run finished" else 130
