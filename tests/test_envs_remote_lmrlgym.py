"""The ``remote`` env's LMRL-Gym dialects (``lmrlgym_maze``, ``lmrlgym_wordle``) against a small HTTP
server with the wire shapes of AgentGym's ``agentenv-lmrlgym`` server (its FastAPI app serves both
games):

    POST /maze/create    (no body)            -> {"id": n}
    POST /maze/reset     {"id", "game"}       -> {"observation"}            game < 26 (start positions)
    POST /maze/step      {"id", "action"}     -> {"observation", "reward", "done"}
    GET  /maze/observation?id=                -> the last observation (a JSON string)
    POST /wordle/create  (no body)            -> {"id": n}
    POST /wordle/reset   {"id", "seed"}       -> {"id", "observation": "Let's start Wordle!"}
    POST /wordle/step    {"id", "action"}     -> {"observation", "reward", "done"}; 1 for the word, else 0

A game's errors come back as HTTP 200 ``{"error": "..."}`` (unknown id, a step after the end, a
game out of range); a body of another shape is a 422 ``{"detail": [...]}`` naming the field, as
FastAPI answers it; an unknown route a 404 ``{"detail": "Not Found"}``. There is no /close, /tasks
or /expert. This server is stricter than FastAPI in one way: it also refuses extra fields (and any
body on create), so a dialect that sends more than the real shape fails here. The games behind the
routes are small stand-ins (an open grid, a six-word vocabulary), not LMRL-Gym's.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from agentgym.envpool.envs.remote import Remote, RemoteEnvError
from agentgym.envpool.pool import EnvPool

GOAL, SIZE = (4, 4), 6
STARTS = [(r, c) for r in range(SIZE) for c in range(SIZE) if (r, c) != GOAL][:26]
WORDS = ["shire", "panic", "felon", "frown", "crane", "slate"]
MOVES = {"move up": (-1, 0), "move down": (1, 0), "move left": (0, -1), "move right": (0, 1)}
SHAPES = {
    "reset": {"maze": {"id": int, "game": int}, "wordle": {"id": int, "seed": int}},
    "step": {"maze": {"id": int, "action": str}, "wordle": {"id": int, "action": str}},
}


def maze_text(pos: tuple[int, int]) -> str:
    walls = [
        w
        for w, (dr, dc) in (
            ("above you", (-1, 0)),
            ("below you", (1, 0)),
            ("to your left", (0, -1)),
            ("to your right", (0, 1)),
        )
        if not (0 <= pos[0] + dr < SIZE and 0 <= pos[1] + dc < SIZE)
    ]
    return (
        f"The goal is at position {GOAL[0]}, {GOAL[1]}. Your current position is at position {pos[0]}, {pos[1]}. "
        + (f"There are walls {', '.join(walls)}." if walls else "There are no walls around you.")
    )


class LmrlGym:
    """Both games' state: one dict per env id and game, as the real server keeps them."""

    def __init__(self) -> None:
        self.envs: dict[str, dict[int, dict[str, Any]]] = {"maze": {}, "wordle": {}}
        self.requests: list[tuple[str, str, Any]] = []
        self.lock = threading.Lock()

    def env(self, game: str, idx: int, resetting: bool = False) -> dict[str, Any]:
        e = self.envs[game].get(idx)
        if e is None:
            raise LookupError(f"The id {idx} is not valid.")
        if e["done"] and not resetting:
            raise LookupError(f"The task with environment {idx} has finished.")
        return e

    def create(self, game: str) -> dict[str, Any]:
        idx = len(self.envs[game])
        self.envs[game][idx] = {"done": False, "observation": ""}
        return {"id": idx}

    def reset(self, game: str, body: dict[str, Any]) -> dict[str, Any]:
        e = self.env(game, body["id"], resetting=True)
        if game == "maze":
            if not 0 <= body["game"] < len(STARTS):
                raise LookupError(f"The game {body['game']} is not valid.")
            e.update(pos=STARTS[body["game"]], steps=0, done=False, observation=maze_text(STARTS[body["game"]]))
            return {"observation": e["observation"]}
        e.update(word=WORDS[body["seed"] % len(WORDS)], guesses=0, done=False, observation="Let's start Wordle!")
        return {"id": body["id"], "observation": e["observation"]}

    def step(self, game: str, body: dict[str, Any]) -> dict[str, Any]:
        e = self.env(game, body["id"])
        if game == "maze":
            dr, dc = MOVES.get(body["action"].strip(), (0, 0))
            r, c = e["pos"][0] + dr, e["pos"][1] + dc
            if 0 <= r < SIZE and 0 <= c < SIZE:
                e["pos"] = (r, c)
            e["steps"] += 1
            won = e["pos"] == GOAL
            e["done"] = won or e["steps"] >= 50
            e["observation"] = "Success" if won else maze_text(e["pos"])
            return {"observation": e["observation"], "reward": 1.0 if won else 0.0, "done": e["done"]}
        guess = body["action"].strip().split()
        if len(guess) != 5 or "".join(guess) not in WORDS:
            ob, won = "invalid word", False
        else:
            e["guesses"] += 1
            word, won = e["word"], "".join(guess) == e["word"]
            ob = " ".join("g" if g == w else "y" if g in word else "b" for g, w in zip(guess, word, strict=True))
        e["done"] = won or e["guesses"] >= 6
        e["observation"] = ob
        return {"observation": ob, "reward": 1.0 if won else 0.0, "done": e["done"]}


def _shape_errors(body: Any, shape: dict[str, type]) -> list[dict[str, Any]]:
    if not isinstance(body, dict):
        return [{"type": "model_attributes_type", "loc": ["body"], "msg": "Input should be a valid dictionary"}]
    errs = [{"type": "missing", "loc": ["body", k], "msg": "Field required"} for k in shape if k not in body]
    errs += [
        {"type": "extra_forbidden", "loc": ["body", k], "msg": "Extra inputs are not permitted"}
        for k in body
        if k not in shape
    ]
    errs += [
        {"type": t.__name__ + "_type", "loc": ["body", k], "msg": f"Input should be a valid {t.__name__}"}
        for k, t in shape.items()
        if k in body and (type(body[k]) is not t)
    ]
    return errs


def make_handler(games: LmrlGym) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # kept alive, as uvicorn does

        def log_message(self, *args: Any) -> None:
            pass

        def answer(self, status: int, payload: Any) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            games.requests.append(("GET", parts.path, parts.query))
            m = re.fullmatch(r"/(maze|wordle)/observation", parts.path)
            if parts.path == "/":
                return self.answer(200, "This is environment LMRL-Gym.")
            if m is None:
                return self.answer(404, {"detail": "Not Found"})
            ids = parse_qs(parts.query).get("id", [])
            if len(ids) != 1 or not ids[0].isdigit():
                return self.answer(
                    422, {"detail": [{"type": "missing", "loc": ["query", "id"], "msg": "Field required"}]}
                )
            with games.lock:
                try:
                    return self.answer(200, games.env(m.group(1), int(ids[0]))["observation"])
                except LookupError as exc:
                    return self.answer(200, {"error": str(exc)})

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            m = re.fullmatch(r"/(maze|wordle)/(create|reset|step)", self.path)
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                return self.answer(
                    422, {"detail": [{"type": "json_invalid", "loc": ["body"], "msg": "JSON decode error"}]}
                )
            games.requests.append(("POST", self.path, body))
            if m is None:
                return self.answer(404, {"detail": "Not Found"})
            game, route = m.groups()
            if route == "create":
                if raw:
                    return self.answer(
                        422, {"detail": [{"type": "extra_forbidden", "loc": ["body"], "msg": "create takes no body"}]}
                    )
                with games.lock:
                    return self.answer(200, games.create(game))
            errs = _shape_errors(body, SHAPES[route][game])
            if errs:
                return self.answer(422, {"detail": errs})
            with games.lock:
                try:
                    return self.answer(200, getattr(games, route)(game, body))
                except LookupError as exc:
                    return self.answer(200, {"error": str(exc)})

    return Handler


@pytest.fixture()
def lmrl() -> Iterator[tuple[str, LmrlGym]]:
    games = LmrlGym()
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(games))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", games
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def toward_goal(observation: str) -> str:
    """A maze policy that reads the positions from the observation text."""
    (gr, gc), (r, c) = (tuple(map(int, p)) for p in re.findall(r"position (\d+), (\d+)", observation))
    return "move down" if r < gr else "move up" if r > gr else "move right" if c < gc else "move left"


def test_maze_dialect_speaks_the_lmrlgym_maze_routes(lmrl: tuple[str, LmrlGym]) -> None:
    url, games = lmrl
    env = Remote(url=url, dialect="lmrlgym_maze", splits="train=0:26,test=0:26")
    try:
        for game in (3, 17):
            obs = env.reset(game)
            assert obs == maze_text(STARTS[game])
            rewards = []
            for _ in range(20):
                r = env.step(toward_goal(obs))
                rewards.append(r.reward)
                obs = r.observation
                if r.done:
                    break
            assert r.done and obs == "Success" and rewards[-1] == 1.0 and sum(rewards) == 1.0 and r.info["success"]
        assert '"move up", "move down", "move left" or "move right"' in env.instructions()  # the server sends none
        with pytest.raises(RemoteEnvError, match=r"/maze: POST /reset: The game 26 is not valid\."):
            env.reset(26)
    finally:
        env.close()
    posts = [(path, body) for method, path, body in games.requests if method == "POST"]
    # one server-side env, created without a body and reused by each reset; every body exactly the real shape
    assert posts[0] == ("/maze/create", None)
    assert [p for p, _ in posts].count("/maze/create") == 1
    assert posts[1] == ("/maze/reset", {"id": 0, "game": 3})
    assert {tuple(sorted(b)) for p, b in posts if p == "/maze/step"} == {("action", "id")}
    assert not any(p.endswith(("/close", "/tasks", "/expert")) for _, p, _ in games.requests)
    # a URL naming the game's routes works the same (AgentGym's clients are given ".../maze")
    again = Remote(url=url + "/maze/", dialect="lmrlgym_maze", splits="train=0:26")
    try:
        assert again.reset(0) == maze_text(STARTS[0]) and games.requests[-1][1] == "/maze/reset"
    finally:
        again.close()


def test_wordle_dialect_speaks_the_lmrlgym_wordle_routes(lmrl: tuple[str, LmrlGym]) -> None:
    url, games = lmrl
    env = Remote(url=url, dialect="lmrlgym_wordle", splits="train=0:1000,test=1000:1100")
    try:
        assert env.reset(4) == "Let's start Wordle!"  # seed 4: "crane"
        assert "five space-separated letters" in env.instructions()
        seen = [(r.observation, r.reward, r.done) for r in (env.step(g) for g in ("crane!", "s l a t e", "c r a n e"))]
        assert seen == [("invalid word", 0.0, False), ("b b g b g", 0.0, False), ("g g g g g", 1.0, True)]
        assert env.step("c r a n e").observation == "The episode is over."  # answered here, not by the server
        assert env.reset(1) == "Let's start Wordle!"  # the same server-side env plays the next word
        for _ in range(6):
            r = env.step("s h i r e")
        assert r.done and r.reward == 0.0 and r.info["success"] is False
    finally:
        env.close()
    posts = [(path, body) for method, path, body in games.requests if method == "POST"]
    assert [p for p, _ in posts].count("/wordle/create") == 1 and posts[0] == ("/wordle/create", None)
    assert ("/wordle/reset", {"id": 0, "seed": 4}) in posts and ("/wordle/reset", {"id": 0, "seed": 1}) in posts
    assert ("/wordle/step", {"id": 0, "action": "s l a t e"}) in posts


def test_the_server_refuses_other_shapes_and_so_would_the_real_one(lmrl: tuple[str, LmrlGym]) -> None:
    url, games = lmrl
    # The generic agentgym dialect (reset {"id", "data_idx"}) against the maze routes: refused, named.
    wrong = Remote(url=url + "/maze", dialect="agentgym")
    with pytest.raises(RemoteEnvError, match=r"/maze: POST /create: HTTP 422: .*create takes no body"):
        wrong.reset(3)
    wrong.close()
    games.create("maze")
    from agentgym.envpool.envs.remote import request

    with pytest.raises(
        RemoteEnvError, match=r"POST /maze/reset: HTTP 422: .*'loc': \['body', 'game'\], 'msg': 'Field required'"
    ):
        request(url, "POST", "/maze/reset", {"id": 0, "data_idx": 3}, 5)
    with pytest.raises(RemoteEnvError, match=r"POST /wordle/reset: HTTP 422: .*'loc': \['body', 'seed'\]"):
        request(url, "POST", "/wordle/reset", {"id": 0, "game": 3}, 5)
    with pytest.raises(RemoteEnvError, match=r"POST /maze/close: HTTP 404: .*Not Found"):
        request(url, "POST", "/maze/close", {"id": 0}, 5)
    with pytest.raises(RemoteEnvError, match=r"POST /maze/step: The id 9 is not valid\."):
        request(url, "POST", "/maze/step", {"id": 9, "action": "move up"}, 5)
    # no GET /tasks and no expert there: the dialect asks for splits and says there is no expert
    with pytest.raises(ValueError, match=r"dialect 'lmrlgym_maze': the server has no GET /tasks; set option splits"):
        Remote.tasks("train", url=url, dialect="lmrlgym_maze")
    assert Remote.tasks("test", url=url, dialect="lmrlgym_maze", splits="train=0:20,test=20:26") == range(20, 26)
    env = Remote(url=url, dialect="lmrlgym_maze", splits="train=0:26")
    env.reset(1)
    with pytest.raises(RemoteEnvError, match="this server has no expert"):
        env.expert_action()
    env.close()


def test_maze_episodes_through_the_pool(lmrl: tuple[str, LmrlGym]) -> None:
    url, games = lmrl

    async def main() -> None:
        options = {"url": url, "dialect": "lmrlgym_maze", "splits": "train=0:26,test=20:26"}
        async with EnvPool("remote", options, 2) as pool:
            assert pool.task_id("test", 1) == 21

            async def solve(task_id: int) -> float:
                async with pool.episode(task_id) as ep:
                    obs = await ep.reset()
                    total = 0.0
                    for _ in range(20):
                        r = await ep.step(toward_goal(obs))
                        total, obs = total + r.reward, r.observation
                        if r.done:
                            return total
                raise AssertionError(task_id)

            assert await asyncio.gather(*(solve(t) for t in (0, 5, 11, 25))) == [1.0] * 4
            assert pool.stats()["failures"] == {}

    asyncio.run(main())
    assert len(games.envs["maze"]) <= 2  # one server-side env per pool worker
