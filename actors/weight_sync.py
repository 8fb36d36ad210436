"""The actor's weight loop: on each WeightsReady, pull the new version's chunks (this host's relay
if configured, else or on its silence the learner) and load them into the engine in place.

    class Actor(WeightSync): ...           # actors/runtime.py; Actor.run starts weight_loop
    await actor.wait_version(ticket.min_version)

A mix-in of ``actors/runtime.Actor``: it uses the actor's config, Welcome, CURVE keys, engine,
weight buffers, stats, and the ``weights_wanted`` event and ``version_changed`` condition the
receive loop and the players share with it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import structlog

from agentgym.actors.weight_fetch import fetch_weights, to_torch, weights_addr
from agentgym.auth.keys import ClientKeys
from agentgym.protocol.limits import weights_frame

log = structlog.get_logger(__name__)


class WeightSync:
    cfg: Any
    welcome: Any
    keys: ClientKeys | None
    relay_keys: ClientKeys | None
    engine: Any

    def weight_sources(self) -> tuple[list[str], list[ClientKeys | None]]:
        """Where weights come from, best first: this host's relay if configured (agentgym/cluster/relay.py),
        then the learner's weights port; with the CURVE keys for each."""
        a = self.cfg.actor
        learner = weights_addr(a.learner, self.welcome.weights_port)
        if a.weights_relay is None:
            return [learner], [self.keys]
        return [a.weights_relay, learner], [self.relay_keys, self.keys]

    async def weight_loop(self) -> None:
        sources, source_keys = self.weight_sources()
        while True:
            await self.weights_wanted.wait()
            self.weights_wanted.clear()
            ready = self.latest_ready
            if (ready.turn_limit, ready.turn_limits) != (self.turn_limit, self.turn_limits):
                log.info("turn_limits_changed", version=ready.version, turn_limit=ready.turn_limit,
                         per_env=dict(ready.turn_limits), previous=self.turn_limit)  # fmt: skip
            # Episodes that start from now on play these (set before the engine's version moves, so
            # a player waiting for this version starts with them); running ones keep theirs.
            self.turn_limit, self.turn_limits = ready.turn_limit, dict(ready.turn_limits)
            if ready.version > self.engine.version or not self.weights_synced:
                t0 = time.monotonic()
                # An engine that loads a subset of tensors fetches only what changed since its version.
                have = self.engine.version if self.weights_synced and self.engine.partial_updates else -1
                try:
                    version, raw = await fetch_weights(self.ctx, sources, ready, have_version=have, keys=source_keys,
                                                       stall_s=self.cfg.actor.relay_stall_s, into=self.weight_buffers,
                                                       max_frame=weights_frame(ready.total_bytes, ready.tensors))  # fmt: skip
                except TimeoutError as exc:  # no source delivered (or each sent frames over the cap): try again
                    self.stats["weight_fetch_failures"] = self.stats.get("weight_fetch_failures", 0) + 1
                    log.error("weights_fetch_failed", version=ready.version, error=str(exc))
                    await asyncio.sleep(5.0)
                    self.weights_wanted.set()
                    continue
                tensors = to_torch(raw)
                t1 = time.monotonic()
                if version < self.engine.version:  # a restarted learner resumed an older checkpoint
                    log.warning("weights_rolled_back", from_version=self.engine.version, to_version=version)
                    self.engine.version = version
                await self.engine.update_weights(tensors, version)
                self.weights_synced = True
                # Flight recorder: what the engine serves now, when the update covered every tensor
                # (a changed-only update covers some: its digest is not the version's).
                whole = ready.tensors > 0 and getattr(self.engine, "digest_tensors", 0) == ready.tensors
                self.served = (version, getattr(self.engine, "weights_digest", -1) if whole else -1)
                self.stats["weight_updates"] += 1
                log.info("weights_updated", version=version, fetch_s=round(t1 - t0, 3), load_s=round(time.monotonic() - t1, 3),
                         mib=round(sum(len(t.data) for t in raw) / 2**20, 2), tensors=len(raw),
                         kept_mib=round(self.weight_buffers.nbytes / 2**20, 1))  # fmt: skip
            async with self.version_changed:
                self.version_changed.notify_all()

    async def wait_version(self, version: int) -> None:
        async with self.version_changed:
            await self.version_changed.wait_for(
                lambda: self.weights_synced and self.engine.version >= version and self.latest_ready is not None
            )
