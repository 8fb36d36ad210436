"""Env worker: one subprocess hosting one env instance, driven by an ``EnvPool`` over its pipes.

    python -m agentgym.envpool.worker [--parent-pid PID]

Reads length-prefixed requests (``agentgym.protocol.envworker``) from stdin and writes one reply
per request to stdout. Before anything else it moves the frame stream to a private copy of fd 1
and points fd 1 (and ``sys.stdout``) at stderr, so a stray ``print`` in env code, or a C library
writing to fd 1, lands in the pool's log instead of corrupting frames. An exception raised by the
env is answered with ``Failure(kind="env_error")`` carrying its traceback (the pool logs it), and
the worker lives on; a malformed request ends the worker: the stream can no longer be trusted.

The worker ignores SIGINT and SIGTERM (the actor decides when envs stop: a stop signal to the
whole job, Ctrl-C, ``timeout`` or Slurm's ``scancel``, must leave its envs up while it finishes its
episodes' turns and hands them over) and, on Linux, asks to be killed when its parent dies, so a
hung env cannot outlive its actor. The pool stops a worker with Close, or SIGKILL.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import traceback
from typing import TYPE_CHECKING, BinaryIO

from agentgym.protocol.envworker import (
    ENVWORKER_VERSION,
    PREFIX_BYTES,
    Action,
    Close,
    Expert,
    Failure,
    Observation,
    Open,
    Ready,
    Reply,
    Request,
    Reset,
    Step,
    body_length,
    decode_request,
    pack_frame,
)

if TYPE_CHECKING:
    from agentgym.envpool.base import Env

_FRAME_FD: int | None = None


def frame_fd() -> int | None:
    """The fd that carries reply frames in this process (None outside a worker). For tests only."""
    return _FRAME_FD


def ignore_stop_signals() -> None:
    """SIGINT and SIGTERM change nothing here: they reach every process of a job at once, and
    the actor closes its envs itself once its episodes are handed over (see the module docstring)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _die_with_parent(parent_pid: int | None) -> None:
    if sys.platform != "linux" or parent_pid is None:
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        # PR_SET_PDEATHSIG: fires when the thread that spawned us exits; the pool spawns from its
        # event loop's thread, which lives as long as the actor.
        libc.prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def _read_exact(stream: BinaryIO, n: int) -> bytes | None:
    data = stream.read(n)
    if not data:
        return None
    if len(data) < n:
        raise EOFError(f"env worker: stdin closed inside a frame ({len(data)} of {n} bytes)")
    return data


def _read_request(stream: BinaryIO) -> Request | None:
    prefix = _read_exact(stream, PREFIX_BYTES)
    if prefix is None:
        return None  # the pool closed our stdin: exit quietly
    n = body_length(prefix, "env pool")
    body = _read_exact(stream, n) if n else b""
    if body is None:
        raise EOFError(f"env worker: stdin closed before a {n}-byte frame body")
    return decode_request(body)


class _Host:
    """The env and the episode state the protocol needs (reset before step)."""

    def __init__(self) -> None:
        self.env: Env | None = None
        self.reset_done = False

    def serve(self, req: Request) -> Reply:
        if isinstance(req, Open):
            if self.env is not None:
                return Failure(kind="state", message="env worker: Open received twice")
            if req.version != ENVWORKER_VERSION:
                return Failure(
                    kind="protocol",
                    message=f"env worker speaks version {ENVWORKER_VERSION}, the pool sent {req.version}",
                )
            from agentgym.envpool.registry import load_target

            try:
                self.env = load_target(req.target, req.env)(**req.kwargs)
            except Exception as exc:  # noqa: BLE001 - reported to the pool with the traceback
                return Failure(
                    kind="init_error",
                    message=f"env {req.env!r} options {req.kwargs}: {_describe(exc)}",
                    traceback=_traceback(),
                )
            return Ready(version=ENVWORKER_VERSION, pid=os.getpid())
        env = self.env
        if env is None:
            return Failure(kind="state", message=f"env worker: {type(req).__name__} before Open")
        try:
            if isinstance(req, Reset):
                self.reset_done = False
                text = env.reset(req.task_id)
                self.reset_done = True
                instructions = _check_str(env.instructions(), "instructions")
                return Observation(text=_check_str(text, "reset"), instructions=instructions)
            if not self.reset_done:
                return Failure(kind="state", message=f"env worker: {type(req).__name__} before Reset")
            if isinstance(req, Step):
                r = env.step(req.action)
                return Observation(
                    text=_check_str(r.observation, "step observation"),
                    reward=float(r.reward),
                    done=bool(r.done),
                    info=_check_info(r.info),
                )
            if isinstance(req, Expert):
                return Action(text=_check_str(env.expert_action(), "expert_action"))
        except Exception as exc:  # noqa: BLE001 - an env bug fails one episode, not the worker
            return Failure(kind="env_error", message=_describe(exc), traceback=_traceback())
        return Failure(kind="protocol", message=f"env worker: unexpected request {type(req).__name__}")


def _check_str(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} returned {type(value).__name__} {value!r:.80}, expected str")
    return value


def _check_info(info: object) -> dict[str, str | int | float | bool]:
    # Checked here so that a bad info fails the step as an env error, not the pool's decoder.
    if not isinstance(info, dict):
        raise TypeError(f"step info is {type(info).__name__}, expected dict")
    for key, value in info.items():
        if not isinstance(key, str) or len(key) > 256 or not isinstance(value, (str, int, float, bool)):
            raise TypeError(f"step info[{key!r}] = {value!r:.80}: keys must be str, values str/int/float/bool")
    return info


def _encode(reply: Reply) -> bytes:
    try:
        return pack_frame(reply)
    except ValueError as exc:  # FrameTooLarge: e.g. a megabyte-long observation
        return pack_frame(Failure(kind="env_error", message=str(exc)))


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:4000]


def _traceback() -> str:
    return traceback.format_exc()[-16000:]


def main(argv: list[str] | None = None) -> int:
    global _FRAME_FD
    p = argparse.ArgumentParser(prog="python -m agentgym.envpool.worker", description=__doc__.split("\n")[0])
    p.add_argument("--parent-pid", type=int, help="die when this process dies (Linux)")
    args = p.parse_args(argv)
    ignore_stop_signals()
    _die_with_parent(args.parent_pid)

    # Frames go to a private copy of the original stdout; fd 1 becomes stderr for everyone else.
    sys.stdout.flush()
    _FRAME_FD = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    # Env code must not read the pool's requests either: give it an empty stdin.
    in_fd = os.dup(0)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    requests = os.fdopen(in_fd, "rb")
    replies = os.fdopen(_FRAME_FD, "wb", closefd=False)

    host = _Host()
    code = 0
    try:
        while True:
            try:
                req = _read_request(requests)
            except (ValueError, EOFError) as exc:  # ProtocolError is a ValueError
                print(f"env_worker_bad_request pid={os.getpid()} error={exc}", file=sys.stderr)
                replies.write(pack_frame(Failure(kind="protocol", message=str(exc)[:4000])))
                replies.flush()
                code = 2
                break
            if req is None or isinstance(req, Close):
                break
            replies.write(_encode(host.serve(req)))
            replies.flush()
    except BrokenPipeError:
        code = 0  # the pool went away; nobody to answer
    finally:
        if host.env is not None:
            try:
                host.env.close()
            except Exception:  # noqa: BLE001 - exiting anyway; leave the traceback in the log
                traceback.print_exc()
    return code


if __name__ == "__main__":
    # Run main() of the importable module, not of __main__, so that envs importing this module
    # (frame_fd) see the same globals.
    from agentgym.envpool import worker as _worker

    sys.exit(_worker.main())
