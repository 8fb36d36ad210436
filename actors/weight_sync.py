"""The actor's weight loop: on each WeightsReady, pull the new version's chunks (this host's relay
if configured, else or on its silence the learner) and load them into the engine in place.

    weights = WeightSync(cfg.actor, ctx, keys, relay_keys, stats)   # actors/runtime.py wires it
    weights.offer(ready)                             # the receive loop, on each WeightsReady
    tg.create_task(weights.run(engine, welcome.weights_port))
    await weights.wait_version(engine, ticket.min_version)   # a player, before it plays

``WeightSync`` owns the weight state of the actor: the latest WeightsReady, whether the engine
holds the learner's weights, the fetch buffers kept from one update to the next, what the engine
serves (for the heartbeat's flight-recorder fields) and the turn limits of the latest version.
It is given the actor's config, its ZeroMQ context and CURVE keys (to pull chunks) and the
actor's stats; the engine is given to ``run``, which starts once the engine is up.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import structlog
import zmq.asyncio

from agentgym.actors.weight_fetch import fetch_weights, to_torch, weights_addr
from agentgym.auth.keys import ClientKeys
from agentgym.protocol import WeightsReady
from agentgym.protocol.limits import weights_frame
from agentgym.protocol.weights import WeightBuffers, tensor_nbytes

if TYPE_CHECKING:
    from agentgym.actors.engines.engine import GatedEngine
    from agentgym.config import ActorConfig

log = structlog.get_logger(__name__)


class WeightSync:
    """The engine's weights: what the learner announced, what the engine holds, the loop between."""

    def __init__(
        self,
        cfg: ActorConfig,
        ctx: zmq.asyncio.Context,
        keys: ClientKeys | None,
        relay_keys: ClientKeys | None,
        stats: dict[str, int],
    ) -> None:
        self.cfg = cfg
        self.ctx = ctx
        self.keys = keys
        """CURVE keys to the learner's weights port (None: plain TCP)."""
        self.relay_keys = relay_keys
        """CURVE keys to this host's weight relay: this actor's pair, the relay's public key."""
        self.stats = stats
        self.latest: WeightsReady | None = None
        """The newest WeightsReady heard; None until one comes (and again after a learner restart)."""
        self.wanted = asyncio.Event()
        """Set when ``latest`` names weights the engine may not hold: the loop fetches."""
        self.synced = False
        """True once the engine holds the learner's weights of ``engine.version``: at once when it
        loaded the learner's own model directory, else after the first fetch (a directory with the
        same architecture and tokenizer may hold other weights)."""
        self.changed = asyncio.Condition()
        """Notified after each WeightsReady is handled: players waiting for a version re-check."""
        self.buffers = WeightBuffers()
        """Where fetched weights land, kept from one update for the next (no page faults after the first)."""
        self.served = (-1, -1)
        """(version, weights digest) the engine serves: heartbeats report it."""
        self.turn_limit = 1
        self.turn_limits: dict[str, int] = {}
        """Per-env limits of the latest WeightsReady (an env not in it plays ``turn_limit``)."""

    def offer(self, msg: WeightsReady) -> None:
        """A WeightsReady from the learner: fetch it unless a newer one came first."""
        if self.latest is None or msg.version >= self.latest.version:
            self.latest = msg
            self.wanted.set()

    def forget(self) -> None:
        """A restarted learner resumed from a checkpoint: its weights may be older than the
        engine's, and only its weights make trainable groups. Wait for its next WeightsReady."""
        self.latest = None
        self.synced = False

    def turn_limit_for(self, env: str) -> int:
        """The turn limit an episode of ``env`` that starts now plays."""
        return self.turn_limits.get(env, self.turn_limit)

    def sources(self, weights_port: int) -> tuple[list[str], list[ClientKeys | None]]:
        """Where weights come from, best first: this host's relay if configured (agentgym/cluster/relay.py),
        then the learner's weights port; with the CURVE keys for each."""
        learner = weights_addr(self.cfg.learner, weights_port)
        if self.cfg.weights_relay is None:
            return [learner], [self.keys]
        return [self.cfg.weights_relay, learner], [self.relay_keys, self.keys]

    async def run(self, engine: GatedEngine, weights_port: int) -> None:
        """Load each WeightsReady's weights into ``engine``, for the actor's life."""
        sources, source_keys = self.sources(weights_port)
        while True:
            await self.wanted.wait()
            self.wanted.clear()
            ready = self.latest
            if ready is None:  # a learner restart cleared it after it was set: wait for the next
                continue
            if (ready.turn_limit, ready.turn_limits) != (self.turn_limit, self.turn_limits):
                log.info(
                    "turn_limits_changed",
                    version=ready.version,
                    turn_limit=ready.turn_limit,
                    per_env=dict(ready.turn_limits),
                    previous=self.turn_limit,
                )
            # Episodes that start from now on play these (set before the engine's version moves, so
            # a player waiting for this version starts with them); running ones keep theirs.
            self.turn_limit, self.turn_limits = ready.turn_limit, dict(ready.turn_limits)
            if ready.version > engine.version or not self.synced:
                if not await self._update(engine, ready, sources, source_keys):
                    await asyncio.sleep(5.0)
                    self.wanted.set()
                    continue
            async with self.changed:
                self.changed.notify_all()

    async def _update(
        self, engine: GatedEngine, ready: WeightsReady, sources: list[str], source_keys: list[ClientKeys | None]
    ) -> bool:
        """Fetch ``ready``'s weights and load them; False when no source delivered them."""
        t0 = time.monotonic()
        # An engine that loads a subset of tensors fetches only what changed since its version.
        have = engine.version if self.synced and engine.partial_updates else -1
        try:
            version, raw = await fetch_weights(
                self.ctx,
                sources,
                ready,
                have_version=have,
                keys=source_keys,
                stall_s=self.cfg.relay_stall_s,
                into=self.buffers,
                max_frame=weights_frame(ready.total_bytes, ready.tensors),
            )
        except TimeoutError as exc:  # no source delivered (or each sent frames over the cap): try again
            self.stats["weight_fetch_failures"] = self.stats.get("weight_fetch_failures", 0) + 1
            log.error("weights_fetch_failed", version=ready.version, error=str(exc))
            return False
        tensors = to_torch(raw)
        t1 = time.monotonic()
        if version < engine.version:  # a restarted learner resumed an older checkpoint
            log.warning("weights_rolled_back", from_version=engine.version, to_version=version)
            engine.version = version
        await engine.update_weights(tensors, version)
        self.synced = True
        # Flight recorder: what the engine serves now, when the update covered every tensor
        # (a changed-only update covers some: its digest is not the version's).
        whole = ready.tensors > 0 and engine.digest_tensors == ready.tensors
        self.served = (version, engine.weights_digest if whole else -1)
        self.stats["weight_updates"] += 1
        log.info(
            "weights_updated",
            version=version,
            fetch_s=round(t1 - t0, 3),
            load_s=round(time.monotonic() - t1, 3),
            mib=round(sum(tensor_nbytes(t.dtype, t.shape) for t in raw) / 2**20, 2),
            tensors=len(raw),
            kept_mib=round(self.buffers.nbytes / 2**20, 1),
        )
        return True

    async def wait_version(self, engine: GatedEngine, version: int) -> None:
        """Return once ``engine`` holds the learner's weights of ``version`` or newer."""
        async with self.changed:
            await self.changed.wait_for(lambda: self.synced and engine.version >= version and self.latest is not None)
