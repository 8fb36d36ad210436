"""``remote``: an env played on a remote AgentGym env server over HTTP.

Environments that cannot run inside an actor (WebArena's sites, AgentGym's WebShop, ALFWorld, ...)
run on their original AgentGym servers; this env speaks their HTTP API, one server-side env per
env instance (created on the first reset, closed with the env). ``agentgym.envpool.server``
serves any registered env through the same API.

    options:  url: str                        "http://host:port" of the env server (required)
              dialect: str = "agentgym"        the server's field names, see ``DIALECTS``
              timeout_s: float = 60            per HTTP request (connect, send, each read)
              reward_scale: float = 1.0        e.g. 0.01 for SciWorld's 0..100 scores
              score_key: str = ""              if set, the step reply field holding a running score;
                                               the reward is its change (else the "reward" field)
              success_at: float = 1.0          an episode whose rewards add up to this succeeded
              instructions: str = ""           the task text; "" = the server's, if it sends one
              splits: str = ""                 task ids, "train=0:2000,dev=2000:2100,test=2100:2300";
                                               "" = ask the server (``GET /tasks``, agentgym's servers)
              world_type: str = "Text"         ALFWorld's world type (dialect "alfworld")
    reset ->  the server's first observation (its task description first, where it sends one)
    step  ->  the server's observation, reward and done ("terminated"/"truncated" count as done)
    expert:   ``GET /expert`` (agentgym's own server); other servers have none

Dialects (from AgentGym's env servers and clients):

    agentgym        id "id", reset {"data_idx"}            SciWorld, BabyAI, TextCraft, ours
    alfworld        id "id", reset {"game", "world_type"}
    webshop         id "env_idx", reset {"session_id"}; the step reply's text is "state"
    searchqa        id "env_idx", create {"id": 0}, reset {"id"}
    webarena        id "env_idx", reset {"seed": 0, "idx"}; done = "terminated" or "truncated"
    lmrlgym_maze    agentenv-lmrlgym's Maze: routes under /maze, create without a body, reset
                    {"id", "game"} (game: one of the maze's 26 start positions, task ids 0..25)
    lmrlgym_wordle  agentenv-lmrlgym's Wordle: routes under /wordle, reset {"id", "seed"} (any
                    seed picks a word); a guess is five space-separated letters

The LMRL-Gym servers have no /close, /tasks or /expert route and send no instructions: a server-side
env lives as long as the server (one per env instance, reused by every reset), ``splits`` is
required, and the dialect brings short instructions of its own (``instructions`` replaces them).
``url`` may name the server (``http://host:36001``) or the game's routes (``.../maze``).

A server that is down, slow past ``timeout_s``, or answering an error (an HTTP error status or
AgentGym's ``{"error": ...}``) raises ``RemoteEnvError`` naming the server, the route and the
cause: the pool fails that episode (reason ``env_error``); the server-side env is closed if the
server still answers, and the next reset starts afresh with a new one.
"""

from __future__ import annotations

import http.client
import json
import select
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from agentgym.envpool.base import SPLITS, Env, StepResult


class RemoteEnvError(RuntimeError):
    """The env server could not be reached, timed out, or answered an error."""


@dataclass(frozen=True)
class Dialect:
    id_key: str
    reset_key: str
    reset_extra: dict[str, Any] = field(default_factory=dict)
    create_body: dict[str, Any] | None = field(default_factory=dict)
    """JSON body of POST /create (None: no body)."""
    prefix: str = ""
    """Path the server's routes sit under (LMRL-Gym serves two games, /maze/... and /wordle/...)."""
    server_routes: bool = True
    """The server has agentgym's own /close, /tasks and /expert (the LMRL-Gym servers do not)."""
    instructions: str = ""
    """Instructions when the server sends none and the ``instructions`` option is empty."""


DIALECTS = {
    "agentgym": Dialect("id", "data_idx"),
    "alfworld": Dialect("id", "game"),
    "webshop": Dialect("env_idx", "session_id"),
    "searchqa": Dialect("env_idx", "id", create_body={"id": 0}),
    "webarena": Dialect("env_idx", "idx", reset_extra={"seed": 0}),
    "lmrlgym_maze": Dialect(
        "id",
        "game",
        create_body=None,
        prefix="/maze",
        server_routes=False,
        instructions="Reach the goal of the maze. Each observation gives the goal's position, yours and the "
        "walls around you; moving down adds 1 to your first coordinate, moving right to your "
        'second. Answer with one action: "move up", "move down", "move left" or "move right".',
    ),
    "lmrlgym_wordle": Dialect(
        "id",
        "seed",
        create_body=None,
        prefix="/wordle",
        server_routes=False,
        instructions="Guess the hidden five-letter word in at most 6 guesses. Write each guess as five "
        'space-separated letters, e.g. "s h i r e". The feedback has one letter per position: '
        '"g" right letter in the right place, "y" in the word but elsewhere, "b" not in the word; '
        'a word outside the game\'s vocabulary gets "invalid word".',
    ),
}


def base_url(url: str, dialect: Dialect) -> str:
    """The URL the dialect's routes hang off: ``url``, plus the dialect's prefix unless it has it."""
    url = url.rstrip("/")
    if dialect.prefix and not urllib.parse.urlsplit(url).path.rstrip("/").endswith(dialect.prefix):
        url += dialect.prefix
    return url


class Connection:
    """A kept-alive HTTP connection to one server (the env's requests go one at a time)."""

    def __init__(self, url: str) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"remote: option url must be 'http://host:port' of an env server, got {url!r}")
        self.url, self._parts = url, parts
        self._conn: http.client.HTTPConnection | None = None

    def _open(self, timeout: float) -> http.client.HTTPConnection:
        conn = self._conn
        if conn is not None and conn.sock is not None:
            # A server that closed an idle connection makes the socket readable (EOF): reconnect
            # before sending, so a request is never sent into a dead connection (and never twice).
            if select.select([conn.sock], [], [], 0)[0]:
                self.close()
                conn = None
        if conn is None:
            cls = http.client.HTTPSConnection if self._parts.scheme == "https" else http.client.HTTPConnection
            conn = self._conn = cls(
                cast(str, self._parts.hostname), self._parts.port, timeout=timeout
            )  # checked in __init__
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        return conn

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def request(self, method: str, path: str, body: dict[str, Any] | None, timeout: float) -> Any:
        """One JSON request; ``RemoteEnvError`` on any failure, naming the server and the route."""
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if data is not None else {}
        where = f"remote env server {self.url}: {method} {path.split('?')[0]}"
        prefix = self._parts.path.rstrip("/")
        try:
            conn = self._open(timeout)
            conn.request(method, prefix + path, body=data, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
            if resp.will_close:
                self.close()
        except ConnectionRefusedError as exc:
            self.close()
            raise RemoteEnvError(f"{where}: cannot reach the server: {exc}") from None
        except TimeoutError:
            self.close()
            raise RemoteEnvError(f"{where}: no answer within {timeout:g} s") from None
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            raise RemoteEnvError(f"{where}: connection failed: {type(exc).__name__}: {exc}") from None
        try:
            reply = json.loads(raw) if raw else None
        except ValueError:
            reply = None
            if resp.status < 400:
                raise RemoteEnvError(f"{where}: the answer is not JSON: {raw[:200]!r}") from None
        if resp.status >= 400:
            detail = reply.get("error", reply) if isinstance(reply, dict) else raw[:2000].decode(errors="replace")
            raise RemoteEnvError(f"{where}: HTTP {resp.status}: {detail}")
        if isinstance(reply, dict) and reply.get("error"):
            raise RemoteEnvError(f"{where}: {reply['error']}")
        return reply


def request(url: str, method: str, path: str, body: dict[str, Any] | None, timeout: float) -> Any:
    """One JSON request on a connection of its own (see ``Connection.request``)."""
    conn = Connection(url)
    try:
        return conn.request(method, path, body, timeout)
    finally:
        conn.close()


def parse_splits(text: str) -> dict[str, range]:
    """``"train=0:2000,test=2000:2200"`` -> {"train": range(0, 2000), "test": range(2000, 2200)}."""
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, span = part.partition("=")
        start, _, stop = span.partition(":")
        if name.strip() not in SPLITS or not start.strip().isdigit() or not stop.strip().isdigit():
            raise ValueError(f"remote: option splits: bad part {part!r}; write e.g. 'train=0:2000,test=2000:2200'")
        out[name.strip()] = range(int(start), int(stop))
    return out


def _text(reply: Any, where: str) -> str:
    """The observation in a reply: a string, the first item of a list, or a dict's field."""
    if isinstance(reply, str):
        return reply
    if isinstance(reply, list) and reply and isinstance(reply[0], str):
        return reply[0]  # WebShop's reset answers [observation, null]
    if isinstance(reply, dict):
        for key in ("observation", "state"):
            if isinstance(reply.get(key), str):
                task = reply.get("task_description")
                return f"{task}\n{reply[key]}" if isinstance(task, str) and task else reply[key]
    raise RemoteEnvError(f"{where}: no observation in the answer {json.dumps(reply)[:300]}")


class Remote(Env):
    name = "remote"
    replayable = False  # the episode's state lives on the server: played again, not replayed

    def __init__(
        self,
        url: str = "",
        dialect: str = "agentgym",
        timeout_s: float = 60,
        reward_scale: float = 1.0,
        score_key: str = "",
        success_at: float = 1.0,
        instructions: str = "",
        splits: str = "",
        world_type: str = "Text",
        **kwargs: object,
    ) -> None:
        super().__init__(**kwargs)
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"remote: option url must be 'http://host:port' of an env server, got {url!r}")
        if dialect not in DIALECTS:
            raise ValueError(f"remote: unknown dialect {dialect!r}; dialects are {sorted(DIALECTS)}")
        if not timeout_s > 0:
            raise ValueError(f"remote: option timeout_s must be > 0, got {timeout_s!r}")
        parse_splits(splits)  # a typo is an error now, not at the first evaluation
        self.dialect, self.timeout_s = DIALECTS[dialect], float(timeout_s)
        self.url = base_url(url, self.dialect)
        self._http = Connection(self.url)
        self.reward_scale, self.score_key, self.success_at = float(reward_scale), score_key, float(success_at)
        self.world_type = world_type
        self._instructions = instructions
        self._server_instructions = ""
        self._id: int | None = None
        self._score = 0.0
        self._total = 0.0
        self._done = False

    @classmethod
    def tasks(cls, split: str = "train", **options: object) -> Sequence[int]:
        if split not in SPLITS:
            raise ValueError(f"env remote: unknown split {split!r}; splits are {list(SPLITS)}")
        spans = parse_splits(str(options.get("splits", "")))
        if spans:
            if split not in spans:
                raise ValueError(f"env remote: option splits has no {split!r} part: {options.get('splits')!r}")
            return spans[split]
        dialect = DIALECTS.get(str(options.get("dialect", "agentgym")))
        if dialect is not None and not dialect.server_routes:
            raise ValueError(
                f"env remote: dialect {options.get('dialect')!r}: the server has no GET /tasks; set "
                "option splits, e.g. 'train=0:26,test=0:26'"
            )
        url = str(options.get("url", "")).rstrip("/")
        # Called by the actor's pool once per split (then cached), outside the env workers: keep
        # the wait short; the ``splits`` option avoids the call.
        timeout = min(float(options.get("timeout_s", 60)), 10.0)  # type: ignore[arg-type]  # a number option, as the constructor checks
        reply = request(url, "GET", f"/tasks?split={split}", None, timeout)
        try:
            ranges = [range(int(a), int(b)) for a, b in reply["ranges"]]
        except (TypeError, KeyError, ValueError):
            raise RemoteEnvError(f"remote env server {url}: GET /tasks answered {reply!r:.200}") from None
        if len(ranges) == 1:
            return ranges[0]
        return [i for r in ranges for i in r]

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        try:
            return self._http.request("POST", path, {self.dialect.id_key: self._id, **body}, self.timeout_s)
        except RemoteEnvError:
            # The server-side env is in an unknown state: release it if the server still listens
            # (it may hold a worker there), and let the next reset make a new one.
            self.close()
            raise

    def reset(self, task_id: int) -> str:
        if self._id is None:
            create = self.dialect.create_body
            reply = self._http.request("POST", "/create", None if create is None else dict(create), self.timeout_s)
            env_id = reply.get(self.dialect.id_key, reply.get("id")) if isinstance(reply, dict) else reply
            if not isinstance(env_id, int) or isinstance(env_id, bool):
                raise RemoteEnvError(f"remote env server {self.url}: POST /create answered {reply!r:.200}, no env id")
            self._id = env_id
        body = {self.dialect.reset_key: task_id, **self.dialect.reset_extra}
        if self.dialect is DIALECTS["alfworld"]:
            body["world_type"] = self.world_type
        reply = self._post("/reset", body)
        self._server_instructions = reply.get("instructions", "") if isinstance(reply, dict) else ""
        self._score = self._total = 0.0
        self._done = False
        return _text(reply, f"remote env server {self.url}: POST /reset")

    def instructions(self) -> str:
        return self._instructions or str(self._server_instructions or "") or self.dialect.instructions

    def step(self, action: str) -> StepResult:
        if self._id is None:
            return StepResult("No episode: the env has not been reset.", 0.0, False, {})
        if self._done:  # servers refuse or misbehave on steps after the end; answer here
            return StepResult("The episode is over.", 0.0, True, {"success": False})
        reply = self._post("/step", {"action": action})
        where = f"remote env server {self.url}: POST /step"
        if not isinstance(reply, dict):
            raise RemoteEnvError(f"{where}: answered {reply!r:.200}, not an object")
        text = _text(reply, where)
        done = any(bool(reply.get(k)) for k in ("done", "terminated", "truncated"))
        try:
            if self.score_key:
                raw = reply.get(self.score_key)  # no score in the reply: unchanged
                score = self._score if raw is None else float(raw) * self.reward_scale
                reward, self._score = score - self._score, score
            else:
                reward = float(reply.get("reward") or 0.0) * self.reward_scale
        except (TypeError, ValueError):
            raise RemoteEnvError(f"{where}: reward/score is not a number in {json.dumps(reply)[:300]}") from None
        self._total += reward
        self._done = done
        info: dict[str, Any] = {}
        server_info = reply.get("info")
        if isinstance(server_info, dict):  # keep what fits an info dict (scalars)
            info.update({str(k)[:64]: v for k, v in server_info.items() if isinstance(v, (str, int, float, bool))})
        if done:
            info["success"] = bool(info.get("success", self._total >= self.success_at - 1e-9))
        return StepResult(text, reward, done, info)

    def expert_action(self) -> str:
        if self._id is None:
            raise RemoteEnvError(f"remote env server {self.url}: expert before reset")
        if not self.dialect.server_routes:
            raise RemoteEnvError(f"remote env server {self.url}: this server has no expert (GET /expert)")
        reply = self._http.request("GET", f"/expert?{self.dialect.id_key}={self._id}", None, self.timeout_s)
        if not isinstance(reply, dict) or not isinstance(reply.get("action"), str):
            raise RemoteEnvError(f"remote env server {self.url}: GET /expert answered {reply!r:.200}")
        return reply["action"]

    def close(self) -> None:
        if self._id is not None and not self.dialect.server_routes:
            self._id = None  # no /close there: the server-side env stays until the server stops
        if self._id is not None:
            try:
                self._http.request("POST", "/close", {self.dialect.id_key: self._id}, min(self.timeout_s, 5))
            except RemoteEnvError:
                pass  # the server may be gone already; nothing to release then
            self._id = None
        self._http.close()
