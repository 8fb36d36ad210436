"""Env workers forked from a process that has already imported them: ~5 ms of CPU a start, not ~0.2 s.

    z = await Zygote.start("guess_number", target, timeout=60)   # one per pool (asyncio side)
    proc = await z.spawn(timeout=60)       # a ForkedProcess: pid, stdin, stdout, stderr, wait(), kill()
    await z.close()

A fresh ``python -m agentgym.envpool.worker`` spends ~0.1 s of wall and ~0.2 s of CPU starting
Python and importing the protocol (numpy, msgspec) and the env before it serves a step: the
price of every worker an actor adds when it plays more at once, of every crash replacement and
every recycle. The zygote (``python -m agentgym.envpool.zygote``) pays it once: it imports the
worker module and the env's module, then forks a worker per request. The child is the same
worker (``agentgym.envpool.worker.main``) on the pipes the pool made, so isolation is unchanged:
one env per process, a crash or a hang costs one episode. Pages are shared copy-on-write, so a
forked worker also costs less memory than a started one.

Protocol (a SOCK_SEQPACKET pair, one message a datagram): the pool sends ``spawn`` with three
file descriptors (the child's stdin, stdout, stderr); the zygote forks and answers ``pid N``;
when it reaps a child it sends ``exit N CODE``. The zygote is single-threaded and checks that
it still is after its imports (a thread would not survive a fork): if an env's module starts
threads at import it answers ``unsafe`` and the pool starts workers the old way. The zygote dies
with its actor, and its children die with it (``PR_SET_PDEATHSIG``): killing the zygote fails
the episodes in flight (``crash``), and the pool goes on starting workers without it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import os
import selectors
import signal
import socket
import sys
import traceback

_MSG = 256


class ZygoteError(RuntimeError):
    """The zygote could not start, refused to fork (``unsafe``), or is gone."""


# ---------------------------------------------------------------------- the pool's side (asyncio)
class ForkedProcess:
    """A worker forked by the zygote, with the parts of ``asyncio.subprocess.Process`` the pool uses."""

    def __init__(
        self, pid: int, stdin: asyncio.StreamWriter, stdout: asyncio.StreamReader, stderr: asyncio.StreamReader
    ) -> None:
        self.pid = pid
        self.stdin, self.stdout, self.stderr = stdin, stdout, stderr
        self.returncode: int | None = None
        self._done = asyncio.Event()

    def _exited(self, code: int) -> None:
        if self.returncode is None:
            self.returncode = code
            self.stdin.close()
            self._done.set()

    async def wait(self) -> int:
        await self._done.wait()
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        # Only while the zygote has not reported the exit: after that the pid may be reused.
        if self.returncode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class Zygote:
    def __init__(self, proc: asyncio.subprocess.Process, sock: socket.socket, pid: int) -> None:
        self.proc = proc
        self.sock = sock
        self.pid = pid
        self.alive = True
        """False once the zygote's socket closed (it exited or was killed)."""
        self.usable = True
        """False once a spawn failed: the pool then starts workers itself (a late ``pid`` reply
        must not answer the next request)."""
        self._procs: dict[int, ForkedProcess] = {}
        self._early: dict[int, int] = {}  # exits reported before spawn() made the ForkedProcess
        self._reply: asyncio.Future[int] | None = None
        self._lock = asyncio.Lock()  # one spawn at a time: replies come in request order
        self._reader = asyncio.get_running_loop().create_task(self._read(), name=f"env-zygote-{pid}")

    @classmethod
    async def start(cls, env: str, target: str, timeout: float) -> Zygote:
        """Start a zygote that has imported ``target``'s module; ZygoteError if it cannot fork safely."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "agentgym.envpool.zygote",
                "--fd",
                str(theirs.fileno()),
                "--parent-pid",
                str(os.getpid()),
                "--env",
                env,
                "--target",
                target,
                pass_fds=(theirs.fileno(),),
                env={**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"},
            )
        except OSError as exc:
            ours.close()
            raise ZygoteError(f"cannot start an env zygote for {env!r}: {exc}") from exc
        finally:
            theirs.close()
        ours.setblocking(False)
        loop = asyncio.get_running_loop()
        try:
            first = (await asyncio.wait_for(loop.sock_recv(ours, _MSG), timeout)).decode()
        except (TimeoutError, OSError) as exc:
            first = f"no answer ({type(exc).__name__})"
        if not first.startswith("ready "):
            ours.close()
            if proc.returncode is None:
                proc.kill()
            await proc.wait()
            raise ZygoteError(f"env zygote for {env!r} did not start: {first or 'it exited'}")
        return cls(proc, ours, int(first.split()[1]))

    async def spawn(self, timeout: float, limit: int = 1 << 20) -> ForkedProcess:
        """Fork a worker on fresh pipes; ZygoteError if the zygote is gone or does not answer."""
        loop = asyncio.get_running_loop()
        async with self._lock:
            if not (self.alive and self.usable):
                raise ZygoteError(f"env zygote pid {self.pid} is gone or was given up")
            in_r, in_w = os.pipe()
            out_r, out_w = os.pipe()
            err_r, err_w = os.pipe()
            self._reply = loop.create_future()
            try:
                socket.send_fds(self.sock, [b"spawn"], [in_r, out_w, err_w])
                pid = await asyncio.wait_for(asyncio.shield(self._reply), timeout)
            except BaseException as exc:
                self.usable = False
                for fd in (in_w, out_r, err_r):  # a child forked anyway reads EOF and exits
                    os.close(fd)
                if isinstance(exc, (OSError, TimeoutError)):
                    raise ZygoteError(f"env zygote pid {self.pid} did not fork: {type(exc).__name__} {exc}") from None
                raise
            finally:
                for fd in (in_r, out_w, err_w):  # the child has its own copies now
                    os.close(fd)
        stdout = asyncio.StreamReader(limit=limit, loop=loop)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdout, loop=loop), os.fdopen(out_r, "rb", 0))
        stderr = asyncio.StreamReader(limit=limit, loop=loop)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stderr, loop=loop), os.fdopen(err_r, "rb", 0))
        transport, protocol = await loop.connect_write_pipe(
            lambda: asyncio.streams.FlowControlMixin(loop=loop), os.fdopen(in_w, "wb", 0)
        )
        proc = ForkedProcess(pid, asyncio.StreamWriter(transport, protocol, None, loop), stdout, stderr)
        self._procs[pid] = proc
        if pid in self._early:
            proc._exited(self._early.pop(pid))
        return proc

    async def _read(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while msg := await loop.sock_recv(self.sock, _MSG):
                kind, *rest = msg.decode().split()
                if kind == "pid" and self._reply is not None and not self._reply.done():
                    self._reply.set_result(int(rest[0]))
                elif kind == "exit":
                    pid, code = int(rest[0]), int(rest[1])
                    proc = self._procs.pop(pid, None)
                    if proc is not None:
                        proc._exited(code)
                    else:
                        self._early[pid] = code
        except OSError:
            pass
        finally:
            self.alive = False
            if self._reply is not None and not self._reply.done():
                self._reply.set_exception(ConnectionError("the env zygote closed its socket"))
            for proc in self._procs.values():  # they die with the zygote (PR_SET_PDEATHSIG)
                proc._exited(-signal.SIGKILL)
            self._procs.clear()

    async def close(self) -> None:
        """End the zygote (its idle children are the pool's to stop first)."""
        self._reader.cancel()  # first: the loop stops watching the socket before it is closed
        await asyncio.gather(self._reader, return_exceptions=True)
        self.sock.close()  # the zygote reads EOF and exits
        try:
            await asyncio.wait_for(self.proc.wait(), 5)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()


# ---------------------------------------------------------------------- the zygote process
def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1  # not Linux: nothing to check with


def _child(fds: list[int], zygote_pid: int, env: str) -> None:
    """In the forked child: become a worker on the pool's pipes, never return."""
    code = 1
    try:
        for i, fd in enumerate(fds):
            os.dup2(fd, i)
            os.close(fd)
        try:  # what ps, top and psutil show: a worker, not a second zygote
            import setproctitle

            setproctitle.setproctitle(f"agentgym.envpool.worker env={env} forked-by={zygote_pid}")
        except ImportError:
            pass
        from agentgym.envpool import worker

        code = worker.main(["--parent-pid", str(zygote_pid)])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - reported on the worker's stderr, which the pool logs
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - exiting anyway
                pass
        os._exit(code)


def serve(sock: socket.socket, parent_pid: int, env: str, target: str) -> int:
    from agentgym.envpool import worker
    from agentgym.envpool.registry import load_target

    with contextlib.suppress(ImportError):
        import setproctitle  # noqa: F401 - imported once here, used by every child
    worker._die_with_parent(parent_pid)  # noqa: SLF001 - the same rules as a worker's
    worker.ignore_stop_signals()  # the forked workers inherit it
    try:
        cls = load_target(target, env)  # the env's module, once, for every child
        for module in cls.preload:  # and the packages it imports lazily (Env.preload)
            with contextlib.suppress(ImportError):
                importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - the pool falls back to starting workers itself
        sock.send(f"unsafe cannot import {target}: {type(exc).__name__}: {exc}"[:_MSG].encode())
        return 1
    if (n := _threads()) > 1:
        sock.send(f"unsafe {n} threads after importing {target}".encode())
        return 1
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so the wakeup fd is written
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ)
    sel.register(wake_r, selectors.EVENT_READ)
    me = os.getpid()
    sock.send(f"ready {me}".encode())

    def reap() -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            sock.send(f"exit {pid} {os.waitstatus_to_exitcode(status)}".encode())

    while True:
        for key, _ in sel.select():
            if key.fileobj == wake_r:
                os.read(wake_r, 4096)
                continue
            msg, fds, _, _ = socket.recv_fds(sock, _MSG, 3)
            if not msg:
                return 0  # the pool closed the socket: our children go with us
            if msg != b"spawn" or len(fds) != 3:
                for fd in fds:
                    os.close(fd)
                print(f"env_zygote_bad_request msg={msg[:64]!r} fds={len(fds)}", file=sys.stderr)
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                sel.close()
                sock.close()
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                os.close(wake_r)
                os.close(wake_w)
                _child(fds, me, env)
            for fd in fds:
                os.close(fd)
            sock.send(f"pid {pid}".encode())
        reap()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m agentgym.envpool.zygote", description=__doc__.split("\n")[0])
    p.add_argument("--fd", type=int, required=True, help="this end of the pool's SOCK_SEQPACKET pair")
    p.add_argument("--parent-pid", type=int, required=True, help="die when this process dies (Linux)")
    p.add_argument("--env", required=True)
    p.add_argument("--target", required=True, help="module.path:ClassName of the env")
    args = p.parse_args(argv)
    sock = socket.socket(fileno=args.fd)
    try:
        return serve(sock, args.parent_pid, args.env, args.target)
    except (BrokenPipeError, ConnectionResetError):
        return 0  # the pool went away


if __name__ == "__main__":
    sys.exit(main())
