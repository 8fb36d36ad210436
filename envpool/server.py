"""Serve a registered env over the AgentGym env-server HTTP API, each env in its own subprocess.

    agentgym serve-env guess_number --kwargs '{"high": 8}' --size 4 --port 8000

    with EnvServer("sciworld", {}, size=2) as server:     # port 0: a free port on 127.0.0.1
        server.url                                          # "http://127.0.0.1:PORT"

Routes (JSON bodies; the field names of AgentGym's SciWorld/BabyAI/TextCraft servers):

    GET  /                      "This is environment NAME."
    POST /create                -> {"id": N}
    POST /reset {id, data_idx}  -> {"id", "data_idx", "observation", "instructions", "reward": 0, "done": false}
    POST /step {id, action}     -> {"observation", "reward", "done", "info"}
    GET  /observation?id=N      -> the latest observation (a JSON string)
    POST /close {id}            -> true
    GET  /expert?id=N           -> {"action"}: the env's expert action (an agentgym extension)
    GET  /tasks?split=S         -> {"split", "ranges": [[start, stop], ...]}: the env's task ids
    GET  /health                -> the pool's counters

An error is answered with a 4xx/5xx status and ``{"error": "..."}`` naming what went wrong (AgentGym's
servers answer 200 with the same ``error`` field; the client reads both). Episodes run on an
``EnvPool`` of ``size`` env worker subprocesses: an env that crashes or hangs fails its episode
(502, the pool's reason) and nothing else. A reset takes a worker until the episode is done or the
id is reset or closed; when all are taken, a reset waits up to ``wait_s`` and then answers 503.

The standard library's ``ThreadingHTTPServer`` serves (a few small JSON routes need no framework);
its handler threads hand each request to the pool's asyncio loop, which runs in one more thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import threading
from collections.abc import Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast
from urllib.parse import parse_qs, urlsplit

import structlog

from agentgym.envpool.pool import EnvFailure, EnvPool, Episode

log = structlog.get_logger(__name__)

MAX_BODY = 1 << 20


class HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _Env:
    """One client's env (an id): the episode it plays, if any, and its latest observation."""

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.stack: contextlib.AsyncExitStack | None = None
        self.episode: Episode | None = None
        self.observation = ""

    async def release(self) -> None:
        stack, self.stack, self.episode = self.stack, None, None
        if stack is not None:
            await stack.aclose()


def task_ranges(ids: Sequence[int]) -> list[list[int]]:
    """Task ids as [start, stop) runs (a ``range`` is one run)."""
    if isinstance(ids, range) and ids.step == 1:
        return [[ids.start, ids.stop]] if len(ids) else []
    runs: list[list[int]] = []
    for i in ids:
        if runs and runs[-1][1] == i:
            runs[-1][1] += 1
        else:
            runs.append([int(i), int(i) + 1])
    return runs


class EnvServer:
    """An HTTP server for env ``env_name`` on ``host:port`` (0 = a free port), ``size`` workers."""

    def __init__(
        self,
        env_name: str,
        env_kwargs: dict[str, Any] | None = None,
        size: int = 4,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        wait_s: float = 30,
        max_envs: int = 1024,
        step_timeout_s: float = 30,
        reset_timeout_s: float = 60,
        start_timeout_s: float = 60,
    ) -> None:
        self.env_name = env_name
        self.pool = EnvPool(
            env_name,
            env_kwargs or {},
            size,
            step_timeout_s=step_timeout_s,
            reset_timeout_s=reset_timeout_s,
            start_timeout_s=start_timeout_s,
        )
        self.wait_s, self.max_envs = wait_s, max_envs
        # A request never waits on the loop for longer than this (the pool's own deadlines are shorter).
        self._request_s = max(step_timeout_s, reset_timeout_s) + wait_s + 10
        self._envs: dict[int, _Env] = {}
        self._next_id = 0
        self._loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self._loop.run_forever, name="env-server-loop", daemon=True)
        handler = type("Handler", (_Handler,), {"server_obj": self})
        self._http = ThreadingHTTPServer((host, port), handler)
        self._http.daemon_threads = True
        self._http_thread = threading.Thread(target=self._http.serve_forever, name="env-server-http", daemon=True)
        self._started = False

    @property
    def url(self) -> str:
        host, port = cast("tuple[str, int]", self._http.server_address[:2])  # a TCP server's
        return f"http://{host}:{port}"

    def start(self) -> EnvServer:
        """Start the env workers (``EnvStartError`` if they cannot), then serve."""
        self._loop_thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self.pool.start(), self._loop).result()
        except BaseException:
            self._stop_loop()
            self._http.server_close()
            raise
        self._http_thread.start()
        self._started = True
        log.info("env_server_started", env=self.env_name, url=self.url, size=self.pool.size)
        return self

    def close(self) -> None:
        """Stop serving, stop every env worker."""
        if self._started:
            self._http.shutdown()
        self._http.server_close()
        if self._loop_thread.is_alive():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(timeout=60)
            self._stop_loop()
        self._started = False

    def __enter__(self) -> EnvServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._loop_thread.join(timeout=10)

    async def _shutdown(self) -> None:
        for env in list(self._envs.values()):
            with contextlib.suppress(Exception):
                await env.release()
        self._envs.clear()
        await self.pool.close()

    # ------------------------------------------------------------------ requests (called from handler threads)
    def handle(self, method: str, path: str, query: dict[str, str], body: dict[str, Any]) -> Any:
        routes = {
            ("GET", "/"): self._hello,
            ("POST", "/create"): self._create,
            ("POST", "/reset"): self._reset,
            ("POST", "/step"): self._step,
            ("GET", "/observation"): self._observation,
            ("POST", "/close"): self._close,
            ("GET", "/expert"): self._expert,
            ("GET", "/tasks"): self._tasks,
            ("GET", "/health"): self._health,
        }
        route = routes.get((method, path))
        if route is None:
            known = sorted({p for _, p in routes})
            raise HttpError(404, f"no route {method} {path}; routes: {known}")
        args = {**query, **body}
        future = asyncio.run_coroutine_threadsafe(route(args), self._loop)
        try:
            return future.result(timeout=self._request_s)
        except FutureTimeout:
            future.cancel()
            raise HttpError(504, f"{method} {path}: no answer within {self._request_s:.0f} s") from None

    async def _hello(self, args: dict[str, Any]) -> Any:
        return f"This is environment {self.env_name}."

    async def _health(self, args: dict[str, Any]) -> Any:
        return {**self.pool.stats(), "ids": len(self._envs)}

    async def _tasks(self, args: dict[str, Any]) -> Any:
        split = str(args.get("split", "train"))
        from agentgym.envpool.registry import load_target

        try:
            ids = load_target(self.pool.target, self.env_name).tasks(split, **self.pool.env_kwargs)
        except ValueError as exc:
            raise HttpError(400, str(exc)) from None
        return {"split": split, "ranges": task_ranges(ids)}

    async def _create(self, args: dict[str, Any]) -> Any:
        if len(self._envs) >= self.max_envs:
            raise HttpError(503, f"{len(self._envs)} envs are open, the most this server keeps; close some")
        env_id = self._next_id
        self._next_id += 1
        self._envs[env_id] = _Env()
        return {"id": env_id}

    def _env(self, args: dict[str, Any], route: str) -> tuple[int, _Env]:
        env_id = _int(args, "id", route)
        env = self._envs.get(env_id)
        if env is None:
            raise HttpError(404, f"{route}: no env with id {env_id} (create one with POST /create)")
        return env_id, env

    async def _reset(self, args: dict[str, Any]) -> Any:
        env_id, env = self._env(args, "/reset")
        task_id = _int(args, "data_idx", "/reset")
        async with env.lock:
            await env.release()
            stack = contextlib.AsyncExitStack()
            try:
                episode = await asyncio.wait_for(stack.enter_async_context(self.pool.episode(task_id)), self.wait_s)
            except TimeoutError:
                await stack.aclose()
                raise HttpError(
                    503, f"/reset: all {self.pool.size} env workers stayed busy for {self.wait_s:g} s"
                ) from None
            env.stack, env.episode = stack, episode
            try:
                env.observation = await episode.reset()
            except EnvFailure as exc:
                await env.release()
                raise HttpError(502, f"/reset id {env_id} data_idx {task_id}: {exc}") from None
            return {
                "id": env_id,
                "data_idx": task_id,
                "observation": env.observation,
                "instructions": episode.instructions,
                "reward": 0.0,
                "done": False,
            }

    async def _step(self, args: dict[str, Any]) -> Any:
        env_id, env = self._env(args, "/step")
        action = args.get("action")
        if not isinstance(action, str):
            raise HttpError(400, f"/step: field 'action' must be a string, got {action!r:.80}")
        async with env.lock:
            if env.episode is None:
                raise HttpError(409, f"/step: env {env_id} has no episode running (POST /reset first)")
            try:
                r = await env.episode.step(action)
            except EnvFailure as exc:
                await env.release()
                raise HttpError(502, f"/step id {env_id}: {exc}") from None
            env.observation = r.observation
            if r.done:  # the worker can serve another episode; the observation stays readable
                await env.release()
            return {"observation": r.observation, "reward": r.reward, "done": r.done, "info": r.info}

    async def _observation(self, args: dict[str, Any]) -> Any:
        return self._env(args, "/observation")[1].observation

    async def _expert(self, args: dict[str, Any]) -> Any:
        env_id, env = self._env(args, "/expert")
        async with env.lock:
            if env.episode is None:
                raise HttpError(409, f"/expert: env {env_id} has no episode running")
            try:
                return {"action": await env.episode.expert_action()}
            except EnvFailure as exc:
                await env.release()
                raise HttpError(502, f"/expert id {env_id}: {exc}") from None

    async def _close(self, args: dict[str, Any]) -> Any:
        env_id, env = self._env(args, "/close")
        async with env.lock:
            await env.release()
            self._envs.pop(env_id, None)
        return True


def _int(args: dict[str, Any], key: str, route: str) -> int:
    value = args.get(key)
    if isinstance(value, str) and value.isdigit():  # query strings
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise HttpError(400, f"{route}: field {key!r} must be a non-negative integer, got {value!r:.80}")
    return value


class _Handler(BaseHTTPRequestHandler):
    server_obj: EnvServer
    protocol_version = "HTTP/1.1"
    # Headers and body leave in two writes: with Nagle's algorithm on, the body waits for the
    # client's delayed ACK (~40 ms per request on Linux).
    disable_nagle_algorithm = True

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def _serve(self, method: str) -> None:
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        try:
            body = self._body(method)
            status, payload = 200, self.server_obj.handle(method, url.path, query, body)
        except HttpError as exc:
            status, payload = exc.status, {"error": str(exc)}
        except Exception as exc:  # noqa: BLE001 - a bug answers 500 with its name, the server lives on
            log.exception("env_server_error", path=url.path)
            status, payload = 500, {"error": f"{type(exc).__name__}: {exc}"}
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self, method: str) -> dict[str, Any]:
        length = self.headers.get("Content-Length") or "0"
        try:
            n = int(length)
        except ValueError:
            n = -1
        if n < 0:  # read(-1) would read until the client closes: no cap at all
            self.close_connection = True
            raise HttpError(400, f"Content-Length must be a non-negative integer, got {length!r:.40}")
        if n > MAX_BODY:
            # Refused unread: the connection closes rather than read a body it would discard.
            self.close_connection = True
            log.warning(
                "env_request_refused",
                path=urlsplit(self.path).path,
                content_length=n,
                frame_cap_bytes=MAX_BODY,
                client=self.client_address[0],
            )
            raise HttpError(413, f"request body of {n} bytes; the limit is {MAX_BODY}")
        raw = self.rfile.read(n) if n else b""
        if method == "GET" or not raw:
            return {}
        try:
            body = json.loads(raw)
        except ValueError as exc:
            raise HttpError(400, f"{self.path}: body is not JSON: {exc}") from None
        if not isinstance(body, dict):
            raise HttpError(400, f"{self.path}: body must be a JSON object, got {type(body).__name__}")
        return body

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        log.debug("env_server_request", line=format % args)


def serve_until_stopped(server: EnvServer) -> int:
    """Start ``server``, print where it serves, and serve until Ctrl-C or SIGTERM; returns the exit
    code. The command (``agentgym serve-env``, agentgym/cli/serve_env.py) builds the server and
    calls this."""
    server.start()
    print(f"serving {server.env_name} on {server.url}", flush=True)
    # Ctrl-C and SIGTERM stop the server, even when started with SIGINT ignored (a background
    # job of a non-interactive shell inherits SIG_IGN and Python then installs no handler).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    stop = threading.Event()
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    # ``python -m agentgym.envpool.server ENV ...`` is ``agentgym serve-env ENV ...``: run as that
    # command (same process, same flags) rather than import the CLI into envpool.
    import os
    import sys

    os.execv(sys.executable, [sys.executable, "-m", "agentgym.cli", "serve-env", *sys.argv[1:]])
