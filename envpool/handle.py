"""The pool's handle on one env worker subprocess (asyncio): spawn, request/reply, stop.

    w = await WorkerHandle.spawn("guess_number", target, {"high": 8}, timeout=60)
    reply = await w.request(Reset(task_id=3), timeout=60)    # Observation, or raises WorkerError
    await w.stop()

Used only by ``agentgym.envpool.pool``. One request is in flight at a time (the episode that
holds the worker owns it). Every wait has a deadline: a reply that does not come in time kills
the process. The worker's stderr is forwarded line by line to this process's log
(``env_worker_output``) and its last lines are kept for failure messages.
"""

from __future__ import annotations

import asyncio
import collections
import os
import sys
import time

import structlog

from agentgym.envpool.zygote import ForkedProcess, Zygote, ZygoteError
from agentgym.protocol.envworker import (
    ENVWORKER_VERSION,
    PREFIX_BYTES,
    Close,
    Failure,
    Open,
    Ready,
    Reply,
    Request,
    body_length,
    decode_reply,
    pack_frame,
)
from agentgym.protocol.errors import ProtocolError

log = structlog.get_logger(__name__)

_STDOUT_LIMIT = 1 << 20  # stream buffer for replies (frames may be larger; readexactly copes)
_TAIL_LINES = 20
_MAX_LINE = 8192
_STOP_GRACE_S = 2.0


class WorkerError(Exception):
    """A request failed. ``reason``: crash, timeout, protocol, start, or the worker's Failure kind
    (env_error, init_error, state). ``alive`` says whether the worker can serve another episode."""

    def __init__(self, reason: str, detail: str, *, alive: bool = False, traceback: str = "") -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail, self.alive, self.traceback = reason, detail, alive, traceback


class WorkerHandle:
    def __init__(self, proc: asyncio.subprocess.Process | ForkedProcess, env: str) -> None:
        self.proc = proc
        self.env = env
        self.pid = proc.pid
        self.forked = isinstance(proc, ForkedProcess)
        """Forked by the pool's zygote (its parent is the zygote, not this process)."""
        self.episodes = 0
        self.busy = False
        """True while a request is in flight: if its caller is cancelled, the stream is out of step."""
        self.dead = False
        self.retiring = False
        self.tail: collections.deque[str] = collections.deque(maxlen=_TAIL_LINES)
        self._pump = asyncio.get_running_loop().create_task(self._pump_stderr(), name=f"env-worker-{self.pid}-stderr")

    @classmethod
    async def spawn(
        cls, env: str, target: str, kwargs: dict, timeout: float, zygote: Zygote | None = None
    ) -> WorkerHandle:
        """Start a worker and build the env in it (Open -> Ready) within ``timeout`` seconds:
        forked by ``zygote`` while it is usable (envpool/zygote.py), else a new Python process."""
        t0 = time.monotonic()
        proc: asyncio.subprocess.Process | ForkedProcess | None = None
        if zygote is not None and zygote.usable and zygote.alive:
            try:
                proc = await zygote.spawn(timeout, limit=_STDOUT_LIMIT)
            except ZygoteError as exc:
                log.warning("env_zygote_unusable", env=env, zygote_pid=zygote.pid, error=str(exc))
        if proc is None:
            try:
                proc = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "agentgym.envpool.worker",
                    "--parent-pid",
                    str(os.getpid()),
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                    limit=_STDOUT_LIMIT,
                )
            except OSError as exc:
                raise WorkerError("start", f"cannot start an env worker for {env!r}: {exc}") from exc
        w = cls(proc, env)
        try:
            reply = await w.request(Open(version=ENVWORKER_VERSION, env=env, target=target, kwargs=kwargs), timeout)
        except WorkerError as exc:
            await w.stop()
            raise WorkerError(exc.reason, f"starting env {env!r}: {exc.detail}", traceback=exc.traceback) from None
        except BaseException:  # cancelled while starting: leave no process behind
            w.kill()
            await asyncio.shield(w.reap())
            raise
        if not isinstance(reply, Ready) or reply.version != ENVWORKER_VERSION:
            await w.stop()
            raise WorkerError("protocol", f"env worker pid {w.pid} answered Open with {reply!r:.200}")
        log.debug("env_worker_started", env=env, pid=w.pid, forked=w.forked, seconds=round(time.monotonic() - t0, 3))
        return w

    async def request(self, msg: Request, timeout: float) -> Reply:
        """Send ``msg`` and wait for its reply; a Failure reply is raised as WorkerError."""
        what = type(msg).__name__
        if self.dead or self.proc.returncode is not None:  # killed by us, or its exit is known
            code = "" if self.proc.returncode is None else f", exit code {self.proc.returncode}"
            self.dead = True
            raise WorkerError("crash", f"env worker pid {self.pid} is gone{code} ({what} not sent)" + self._tail_text())
        if self.busy:  # a reply is still owed to an earlier request: the stream would be out of step
            raise RuntimeError(
                f"env worker pid {self.pid}: {what} sent while a request is in flight (concurrent calls on one episode?)"
            )
        try:
            frame = pack_frame(msg)
        except ProtocolError as exc:  # e.g. a megabytes-long action: refuse it, the worker is fine
            raise WorkerError("protocol", str(exc), alive=True) from None
        stdin, stdout = self.proc.stdin, self.proc.stdout
        assert stdin is not None and stdout is not None
        self.busy = True
        try:
            async with asyncio.timeout(timeout):
                stdin.write(frame)
                await stdin.drain()
                prefix = await stdout.readexactly(PREFIX_BYTES)
                n = body_length(prefix, f"env worker pid {self.pid}")
                body = await stdout.readexactly(n)
            reply = decode_reply(body, f"env worker pid {self.pid}")
        except TimeoutError:
            self.kill()
            raise WorkerError(
                "timeout", f"env worker pid {self.pid} gave no reply to {what} within {timeout:g} s; killed"
            ) from None
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            exit_code = await self._wait_exit()
            raise WorkerError(
                "crash",
                f"env worker pid {self.pid} exited with code {exit_code} during {what} ({type(exc).__name__})"
                + self._tail_text(),
            ) from None
        except ProtocolError as exc:
            self.kill()
            raise WorkerError("protocol", f"{exc}; worker killed") from None
        self.busy = False
        if isinstance(reply, Failure):
            alive = reply.kind in ("env_error", "state")
            if not alive:
                self.kill()
            raise WorkerError(reply.kind, reply.message, alive=alive, traceback=reply.traceback)
        return reply

    @property
    def exited(self) -> bool:
        """The process is gone (killed by us, or exited on its own while idle)."""
        return self.dead or self.proc.returncode is not None

    def kill(self) -> None:
        """Kill the process now (no reaping: ``stop`` or ``reap`` does that)."""
        self.dead = True
        if self.proc.returncode is None:
            try:
                self.proc.kill()
            except ProcessLookupError:
                pass

    async def stop(self, grace_s: float = _STOP_GRACE_S) -> int | None:
        """Ask an idle worker to exit (Close), kill it after ``grace_s``; reap it. Returns the exit code."""
        if not self.dead and not self.busy and self.proc.returncode is None:
            self.dead = True
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(pack_frame(Close()))
                await asyncio.wait_for(self.proc.stdin.drain(), grace_s)
                self.proc.stdin.close()
                await asyncio.wait_for(self.proc.wait(), grace_s)
            except (ConnectionError, TimeoutError):
                pass
        self.kill()
        return await self.reap()

    async def reap(self) -> int | None:
        """Wait for the killed process and its stderr; returns the exit code."""
        code = await self.proc.wait()
        try:
            await asyncio.wait_for(asyncio.shield(self._pump), 1.0)
        except TimeoutError:  # a grandchild holds stderr open: stop listening
            self._pump.cancel()
        return code

    async def _wait_exit(self) -> int | None:
        # The pipe closed: the process is exiting. Give it a moment, then make sure.
        self.dead = True
        try:
            await asyncio.wait_for(self.proc.wait(), _STOP_GRACE_S)
        except TimeoutError:
            self.kill()
        return await self.reap()

    def _tail_text(self) -> str:
        return "; last output: " + " | ".join(self.tail) if self.tail else ""

    async def _pump_stderr(self) -> None:
        assert self.proc.stderr is not None
        pending = b""
        while chunk := await self.proc.stderr.read(65536):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            if len(pending) > _MAX_LINE:
                lines.append(pending)
                pending = b""
            for line in lines:
                self._emit(line)
        if pending:
            self._emit(pending)

    def _emit(self, raw: bytes) -> None:
        line = raw.decode("utf-8", errors="replace").rstrip()[:_MAX_LINE]
        if line:
            self.tail.append(line)
            log.info("env_worker_output", env=self.env, pid=self.pid, line=line)
