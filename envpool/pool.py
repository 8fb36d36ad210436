"""EnvPool: many env episodes at once for an asyncio actor, each env isolated in a subprocess.

    async with EnvPool("guess_number", {"high": 8}, size=8, step_timeout_s=30) as pool:
        async with pool.episode(task_id=7) as ep:      # waits (FIFO) for a free worker
            obs = await ep.reset()                      # ep.instructions is set now
            result = await ep.step("4")                 # StepResult(observation, reward, done, info)
    pool.stats()  # {"episodes": 1, "steps": 1, "failures": {}, "restarts": 0, ...}

``size`` worker processes (``agentgym.envpool.worker``) each host one env instance; an episode
holds one worker from ``episode()`` entry to exit. A crash (the worker exits), a hang (no reply
within ``step_timeout_s`` / ``reset_timeout_s``), an exception in the env, or a corrupt frame
fails that episode with ``EnvFailure`` and nothing else: a dead or suspect worker is killed and
a fresh one is started in the background (within ``start_timeout_s``) for the next episode; a
worker whose env raised is kept. A worker is replaced after ``recycle_after`` episodes, so leaks
in env code stay bounded. If the caller is cancelled during a request, the worker is killed (its
stream is out of step). Workers are forked from a zygote that has imported the env (``fork``,
envpool/zygote.py: ~5 ms of CPU a start instead of ~0.2 s for a new Python), so growing the pool,
replacing a crashed worker and recycling cost little.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import structlog

from agentgym.envpool.base import StepResult
from agentgym.envpool.handle import WorkerError, WorkerHandle
from agentgym.envpool.registry import env_target, load_target
from agentgym.envpool.zygote import Zygote, ZygoteError
from agentgym.protocol.envworker import Action, Expert, Observation, Reply, Request, Reset, Step

log = structlog.get_logger(__name__)

_CLOSED = object()  # queue sentinel: wakes episodes waiting for a worker when the pool closes


class EnvFailure(Exception):
    """One episode's env failed. ``reason``: ``crash`` (the worker exited), ``timeout`` (no reply in
    time), ``env_error`` (the env raised), ``protocol`` (a corrupt frame), ``start`` / ``init_error``
    (a replacement worker could not be started), ``state`` (a request out of order)."""

    def __init__(self, reason: str, env: str, task_id: int, detail: str = "") -> None:
        super().__init__(f"env {env!r} task {task_id}: {reason}" + (f": {detail}" if detail else ""))
        self.reason, self.env, self.task_id, self.detail = reason, env, task_id, detail


class EnvStartError(RuntimeError):
    """``EnvPool.start`` could not start its workers (bad env options, an import error, ...)."""


class Episode:
    """One episode on one worker; made by ``EnvPool.episode``. ``reset`` first, once."""

    def __init__(self, pool: EnvPool, worker: WorkerHandle | None, task_id: int) -> None:
        self.task_id = task_id
        self.instructions = ""
        """The env's task text (``Env.instructions``), set by ``reset``."""
        self.turns = 0
        self._pool = pool
        self._worker = worker
        self._reset_called = False
        self._released = False
        self._failure: EnvFailure | None = None

    @property
    def worker_pid(self) -> int | None:
        """Pid of the worker process hosting this episode (None before a replacement starts)."""
        return self._worker.pid if self._worker is not None else None

    async def reset(self) -> str:
        """Start the episode; returns the first observation."""
        if self._reset_called:
            raise RuntimeError(f"Episode(task {self.task_id}).reset called twice; open a new pool.episode()")
        self._reset_called = True
        pool = self._pool
        if self._worker is not None and self._worker.exited:  # died while idle (OOM killer, kill -9)
            log.warning("env_worker_lost", env=pool.env_name, pid=self._worker.pid, code=self._worker.proc.returncode)
            pool._retire(self._worker)
            self._worker = None
        if self._worker is None:  # the slot's worker died or was recycled: start its replacement
            try:
                self._worker = await pool._spawn()
            except WorkerError as exc:
                raise self._fail(exc) from None
            pool._adopt(self._worker, restart=True)
        reply = await self._call(Reset(task_id=self.task_id), pool.reset_timeout_s, Observation)
        self.instructions = reply.instructions
        return reply.text

    async def step(self, action: str) -> StepResult:
        """Send the agent's action; every call is a turn, valid or not."""
        reply = await self._call(Step(action=action), self._pool.step_timeout_s, Observation)
        self.turns += 1
        self._pool._steps += 1
        return StepResult(reply.text, reply.reward, reply.done, dict(reply.info))

    async def expert_action(self) -> str:
        """The env's scripted expert action for the current state."""
        return (await self._call(Expert(), self._pool.step_timeout_s, Action)).text

    async def _call(self, msg: Request, timeout: float, expect: type[Reply]) -> Any:
        if self._failure is not None:  # the env is gone or in an unknown state: fail again
            f = self._failure
            raise EnvFailure(f.reason, f.env, f.task_id, f"episode already failed: {f.detail}")
        if self._released:  # its worker may serve another episode now
            raise RuntimeError(f"Episode(task {self.task_id}): {type(msg).__name__} after its `async with` ended")
        if not self._reset_called:
            raise RuntimeError(f"Episode(task {self.task_id}): {type(msg).__name__} before reset()")
        assert self._worker is not None
        try:
            reply = await self._worker.request(msg, timeout)
        except WorkerError as exc:
            raise self._fail(exc) from None
        if not isinstance(reply, expect):
            self._worker.kill()
            raise self._fail(WorkerError("protocol", f"{type(msg).__name__} answered with {type(reply).__name__}"))
        return reply

    def _fail(self, exc: WorkerError) -> EnvFailure:
        pool = self._pool
        self._failure = EnvFailure(exc.reason, pool.env_name, self.task_id, exc.detail)
        pool._failures[exc.reason] += 1
        pid = self._worker.pid if self._worker is not None else None
        where = {"traceback": exc.traceback} if exc.traceback else {}
        log.warning(
            "env_failure", env=pool.env_name, task=self.task_id, reason=exc.reason, pid=pid, detail=exc.detail, **where
        )
        return self._failure


class EnvPool:
    """``size`` env worker subprocesses and the episodes played on them (asyncio only)."""

    def __init__(
        self,
        env_name: str,
        env_kwargs: dict[str, Any],
        size: int,
        *,
        step_timeout_s: float = 30,
        reset_timeout_s: float = 60,
        recycle_after: int = 1000,
        start_timeout_s: float = 60,
        fork: bool = True,
    ) -> None:
        self.target = env_target(env_name, "EnvPool env_name")  # UnknownEnvError before any process
        if size < 1:
            raise ValueError(f"EnvPool({env_name!r}): size must be >= 1, got {size}")
        timeouts = {"step_timeout_s": step_timeout_s, "reset_timeout_s": reset_timeout_s}
        for key, value in {**timeouts, "start_timeout_s": start_timeout_s}.items():
            if not value > 0:
                raise ValueError(f"EnvPool({env_name!r}): {key} must be > 0, got {value}")
        if recycle_after < 1:
            raise ValueError(f"EnvPool({env_name!r}): recycle_after must be >= 1, got {recycle_after}")
        self.env_name = env_name
        self.env_kwargs = dict(env_kwargs)
        self.size = size
        self.step_timeout_s = float(step_timeout_s)
        self.reset_timeout_s = float(reset_timeout_s)
        self.start_timeout_s = float(start_timeout_s)
        """Deadline for a new worker to start Python, import the env and build it."""
        self.recycle_after = recycle_after
        self.fork = fork
        """Workers forked from a zygote that has imported the env (envpool/zygote.py), or each a
        new Python process (False; also the fallback when the zygote cannot be used)."""
        self._zygote: Zygote | None = None
        # One slot per worker: a live worker, or None (start a replacement when taken).
        self._slots: asyncio.Queue[WorkerHandle | None | object] = asyncio.Queue()
        self._live: set[WorkerHandle] = set()
        self._chores: set[asyncio.Task[Any]] = set()  # stopping retired/killed workers
        self._spawning: set[asyncio.Task[Any]] = set()  # starting replacements
        self._state = "new"
        self._episodes = self._steps = self._restarts = self._recycled = 0
        self._failures: collections.Counter[str] = collections.Counter()
        self._starts: collections.Counter[str] = collections.Counter()  # workers started: forked / exec
        self._tasks: dict[str, Sequence[int]] = {}

    @property
    def replayable(self) -> bool:
        """The env's ``Env.replayable``: whether its episodes can be handed to another actor."""
        return bool(getattr(load_target(self.target, self.env_name), "replayable", False))

    def task_id(self, split: str, index: int) -> int:
        """The ``index``-th task id (wrapping around) of the env's ``split`` under this pool's
        options: how evaluation tickets, which name a split and an index, become episodes."""
        if split not in self._tasks:
            ids = load_target(self.target, self.env_name).tasks(split, **self.env_kwargs)
            if not len(ids):
                raise ValueError(f"env {self.env_name!r} has no tasks in split {split!r}")
            self._tasks[split] = ids
        ids = self._tasks[split]
        return int(ids[index % len(ids)])

    async def __aenter__(self) -> EnvPool:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Start all workers (concurrently); ``EnvStartError`` if any cannot build the env."""
        if self._state != "new":
            raise RuntimeError(f"EnvPool({self.env_name!r}) is {self._state}; start() runs once")
        self._state = "starting"
        t0 = time.monotonic()
        if self.fork:
            try:
                self._zygote = await Zygote.start(self.env_name, self.target, self.start_timeout_s)
            except ZygoteError as exc:
                log.warning("env_zygote_unavailable", env=self.env_name, error=str(exc))
        spawns = [self._spawn() for _ in range(self.size)]
        results = await asyncio.gather(*spawns, return_exceptions=True)
        workers = [r for r in results if isinstance(r, WorkerHandle)]
        errors = [r for r in results if not isinstance(r, WorkerHandle)]
        if errors:
            await asyncio.gather(*(w.stop() for w in workers))
            self._state = "closed"
            await self._close_zygote()
            first = errors[0]
            if not isinstance(first, WorkerError):
                raise first
            where = {"traceback": first.traceback} if first.traceback else {}
            log.error("env_pool_start_failed", env=self.env_name, error=str(first), **where)
            raise EnvStartError(
                f"EnvPool({self.env_name!r}, {self.env_kwargs}): {len(errors)} of {self.size} workers "
                f"failed to start: {first}"
            ) from None
        for w in workers:
            self._adopt(w, restart=False)
            self._slots.put_nowait(w)
        self._state = "started"
        log.info("env_pool_started", env=self.env_name, size=self.size, seconds=round(time.monotonic() - t0, 2))

    def grow(self, size: int) -> None:
        """Raise the pool to ``size`` workers (an actor that plays more at once); never shrinks.
        The new workers start in the background; episodes take them as they come up."""
        if self._state != "started" or size <= self.size:
            return
        for _ in range(size - self.size):

            async def add() -> None:
                try:
                    w: WorkerHandle | None = await self._spawn()
                except WorkerError as exc:
                    log.warning("env_worker_start_failed", env=self.env_name, error=str(exc))
                    w = None  # an empty slot: the episode that takes it tries again
                if w is not None:
                    self._adopt(w, restart=False)
                    if self._state == "closed":
                        self._retire(w)
                        return
                if self._state != "closed":
                    self._slots.put_nowait(w)

            task = asyncio.get_running_loop().create_task(add(), name=f"env-{self.env_name}-grow")
            self._spawning.add(task)
            task.add_done_callback(self._spawning.discard)
        log.info("env_pool_grown", env=self.env_name, size_from=self.size, size=size)
        self.size = size

    @contextlib.asynccontextmanager
    async def episode(self, task_id: int) -> AsyncIterator[Episode]:
        """Hold a worker for one episode of ``task_id``; waits FIFO while all are busy."""
        if self._state != "started":
            raise RuntimeError(f"EnvPool({self.env_name!r}) is {self._state}; episodes need a started pool")
        slot = await self._slots.get()
        if slot is _CLOSED:
            self._slots.put_nowait(_CLOSED)  # wake the next waiter too
            raise RuntimeError(f"EnvPool({self.env_name!r}) closed while waiting for a worker")
        ep = Episode(self, slot, task_id)  # type: ignore[arg-type]  # a worker (or None), _CLOSED was handled above
        try:
            yield ep
        finally:
            self._release(ep)  # synchronous: a cancelled episode cannot lose its slot

    def _release(self, ep: Episode) -> None:
        ep._released = True
        w = ep._worker
        if ep._reset_called:
            self._episodes += 1
        if w is not None and self._state == "closed":
            self._retire(w)
            return
        if w is not None and (w.dead or w.busy):  # crashed, killed, or cancelled mid-request
            self._retire(w)
            self._replace()
            return
        if w is not None and ep._reset_called:
            w.episodes += 1
            if w.episodes >= self.recycle_after:
                log.info("env_worker_recycled", env=self.env_name, pid=w.pid, episodes=w.episodes)
                self._recycled += 1
                self._retire(w)
                self._replace()
                return
        self._slots.put_nowait(w)

    def _replace(self) -> None:
        """Start a worker for a freed slot in the background, so no episode waits for the start.
        If it cannot start, the slot goes back empty and the next episode tries (and fails alone)."""

        async def replace() -> None:
            w: WorkerHandle | None = None
            try:
                w = await self._spawn()
            except WorkerError as exc:
                log.warning("env_worker_restart_failed", env=self.env_name, error=str(exc))
            if w is not None:
                self._adopt(w, restart=True)
            if self._state != "closed":
                self._slots.put_nowait(w)

        task = asyncio.get_running_loop().create_task(replace(), name=f"env-{self.env_name}-replace")
        self._spawning.add(task)
        task.add_done_callback(self._spawning.discard)

    async def _spawn(self) -> WorkerHandle:
        w = await WorkerHandle.spawn(self.env_name, self.target, self.env_kwargs, self.start_timeout_s, self._zygote)
        self._starts["forked" if w.forked else "exec"] += 1
        return w

    async def _close_zygote(self) -> None:
        if self._zygote is not None:
            zygote, self._zygote = self._zygote, None
            await zygote.close()

    def _adopt(self, w: WorkerHandle, *, restart: bool) -> None:
        self._live.add(w)
        if restart:
            self._restarts += 1
            if self._state == "closed":  # started while the pool closed: do not leak it
                self._retire(w)

    def _retire(self, w: WorkerHandle) -> None:
        """Stop ``w`` in the background (Close, or kill if it is not idle); close() awaits it."""
        if w.retiring:
            return
        w.retiring = True
        if w.busy:
            w.kill()

        async def stop() -> None:
            code = await w.stop()
            self._live.discard(w)
            log.debug("env_worker_stopped", env=self.env_name, pid=w.pid, code=code)

        task = asyncio.get_running_loop().create_task(stop(), name=f"env-worker-{w.pid}-stop")
        self._chores.add(task)
        task.add_done_callback(self._chores.discard)

    async def close(self) -> None:
        """Stop every worker (idle ones get Close, busy ones are killed) and wait for them."""
        if self._state == "closed" and not self._chores and not self._live and not self._spawning:
            return
        self._state = "closed"
        for task in list(self._spawning):  # a replacement that is still starting is not needed
            task.cancel()
        await asyncio.gather(*list(self._spawning), return_exceptions=True)
        while not self._slots.empty():  # idle workers (and empty slots); waiters only wait when empty
            self._slots.get_nowait()
        self._slots.put_nowait(_CLOSED)
        # Idle workers get Close; those held by running episodes too (their next request fails
        # as a crash), and busy ones are killed.
        for w in list(self._live):
            self._retire(w)
        while self._chores:
            await asyncio.gather(*list(self._chores), return_exceptions=True)
        await self._close_zygote()  # after its children: closing it would kill them
        log.info("env_pool_closed", **self.stats())

    def stats(self) -> dict[str, Any]:
        """Counters: episodes (reset called), steps, failures by reason, restarts, recycled, workers,
        and how workers were started (forked by the zygote, or exec'd as a new Python)."""
        return {
            "env": self.env_name,
            "size": self.size,
            "episodes": self._episodes,
            "steps": self._steps,
            "failures": dict(self._failures),
            "restarts": self._restarts,
            "recycled": self._recycled,
            "live_workers": len(self._live),
            "starts": dict(self._starts),
        }
