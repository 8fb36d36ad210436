"""The actor's OpenAI-compatible endpoint: any agent loop written against ``openai.OpenAI`` plays
episodes on the actor's engine, and every call's tokens are kept exactly (actors/play/agent_trace.py).

    endpoint = AgentEndpoint(engine, tokenizer, host="127.0.0.1", port=0)
    await endpoint.start()                               # endpoint.url: http://127.0.0.1:PORT
    session = endpoint.open(AgentTrace(tokenizer, budget), sampling, turn_limit=6, max_tokens=32)
    client = openai.OpenAI(base_url=endpoint.base_url(session), api_key="-")   # unmodified SDK
    ...the agent calls client.chat.completions.create(model=..., messages=...)...
    endpoint.close_session(session); session.trace.to_episode(...)

Routes (aiohttp, in the actor's own asyncio loop):
  GET  /v1/models, /c/{key}/v1/models
  POST /c/{key}/v1/chat/completions       the conversation named by its key in the base URL
  POST /v1/chat/completions               the same, the key in the X-Agentgym-Conversation header
                                          or the body's "agentgym_conversation" field
  POST /c/{key}/reward, /v1/reward        {"reward": 1.0, "success": true}: ends the conversation
Requests: messages, tools, max_tokens (or max_completion_tokens), temperature; n = 1. With
``stream = true`` the finished completion is sent as server-sent events (one content chunk, one
finish chunk, a usage chunk when ``stream_options.include_usage``, then ``[DONE]``): agent loops that
only stream (verifiers' harness programs) work, though nothing arrives before the reply is complete.
Sampling uses rollout.temperature and top_p (the distribution the learner assumes) unless
``request_temperature``. A call past the turn limit (counted in calls) or the token budget is
refused with HTTP 400 and ends the episode as a turn_limit / token_limit truncation. With a
token, every request needs ``Authorization: Bearer TOKEN`` (the SDK sends its api_key so).
A conversation's calls run one at a time, in the order they arrive.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import re
import secrets
import time
from dataclasses import dataclass, field, replace
from typing import Any, Literal, cast

import structlog
from aiohttp import web

from agentgym.actors.engines.engine import InferenceEngine, SamplingSpec
from agentgym.actors.play.agent_trace import AgentTrace, BudgetExceeded

log = structlog.get_logger(__name__)

CONVERSATION_HEADER = "X-Agentgym-Conversation"
CONVERSATION_FIELD = "agentgym_conversation"
"""A request body field naming the conversation: for a client that keeps one base URL and one set
of headers for many conversations but adds body fields per request (verifiers' sampling extras)."""
_TOOL_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.DOTALL)


@dataclass
class Session:
    """One conversation: the episode an agent plays through the endpoint."""

    key: str
    trace: AgentTrace
    sampling: SamplingSpec
    turn_limit: int
    max_tokens: int
    limit: Literal["", "turn_limit", "token_limit"] = ""
    """"turn_limit" / "token_limit" once a call was refused for it (the episode ends there)."""
    reward: float | None = None
    success: bool | None = None
    closed: bool = False
    name: str = ""
    """The episode it plays ("group/index"): its calls' request ids are "agent/{name}/{call}", as
    the native rollout names a turn "group/index/turn" (logs, per-request seeds); else the key."""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def calls(self) -> int:
        return len(self.trace.calls)


class ApiError(Exception):
    def __init__(self, status: int, message: str, code: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


class AgentEndpoint:
    def __init__(
        self,
        engine: InferenceEngine,
        tokenizer: Any,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str = "",
        model_name: str = "policy",
        request_temperature: bool = False,
        max_request_bytes: int = 64 * 2**20,
    ) -> None:
        self.engine, self.tokenizer = engine, tokenizer
        self.max_request_bytes = max_request_bytes
        """Largest request body read (protocol/limits.py, ``agent_request_bytes``); a larger one
        is answered 413 unread past the cap, and logged."""
        self.host, self.port, self.token = host, port, token
        self.model_name, self.request_temperature = model_name, request_temperature
        self.sessions: dict[str, Session] = {}
        self.url = ""
        self._runner: web.AppRunner | None = None

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        app = web.Application(client_max_size=self.max_request_bytes, middlewares=[self._errors])
        app.add_routes(
            [
                web.get("/v1/models", self._models),
                web.get("/c/{key}/v1/models", self._models),
                web.post("/v1/chat/completions", self._chat),
                web.post("/c/{key}/v1/chat/completions", self._chat),
                web.post("/v1/reward", self._reward),
                web.post("/c/{key}/reward", self._reward),
            ]
        )
        # Calls still waiting on the engine when the actor stops get a second, not aiohttp's 60.
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        server = cast(asyncio.Server, site._server)  # a TCPSite's, once started
        host, port = server.sockets[0].getsockname()[:2]  # the port bound when 0 was asked
        self.port = port
        self.url = f"http://{'[' + host + ']' if ':' in host else host}:{port}"
        log.info("agent_endpoint_started", url=self.url, auth=bool(self.token))

    async def close(self) -> None:
        for s in self.sessions.values():
            s.closed = True
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # ------------------------------------------------------------------ conversations
    def open(
        self, trace: AgentTrace, sampling: SamplingSpec, turn_limit: int, max_tokens: int, name: str = ""
    ) -> Session:
        key = secrets.token_hex(12)  # also a capability: only its agent knows it
        s = self.sessions[key] = Session(key, trace, sampling, turn_limit, max_tokens, name=name)
        return s

    def close_session(self, session: Session) -> None:
        session.closed = True
        self.sessions.pop(session.key, None)

    def base_url(self, session: Session) -> str:
        """The base URL an ``openai.OpenAI`` client of this conversation is given."""
        return f"{self.url}/c/{session.key}/v1"

    # ------------------------------------------------------------------ handlers
    @web.middleware
    async def _errors(self, request: web.Request, handler) -> web.StreamResponse:
        try:
            if self.token and not hmac.compare_digest(request.headers.get("Authorization", ""), f"Bearer {self.token}"):
                raise ApiError(401, "missing or wrong bearer token", "invalid_api_key")
            return await handler(request)
        except web.HTTPRequestEntityTooLarge:
            log.warning(
                "agent_request_refused",
                path=request.path,
                content_length=request.content_length,
                frame_cap_bytes=self.max_request_bytes,
                why="request body over the cap (a conversation past the rollout limits)",
            )
            return _error(
                ApiError(
                    413,
                    f"request body over {self.max_request_bytes} bytes, the most a conversation of "
                    "this run's rollout.max_episode_tokens can take",
                    "request_too_large",
                )
            )
        except ApiError as exc:
            return _error(exc)

    def _session(self, request: web.Request, body: dict[str, Any] | None = None) -> Session:
        key = request.match_info.get("key") or request.headers.get(CONVERSATION_HEADER, "")
        if not key and body is not None and isinstance(body.get(CONVERSATION_FIELD), str):
            key = body[CONVERSATION_FIELD]
        if not key:
            raise ApiError(400, f"no conversation: use the base URL /c/KEY/v1 or the {CONVERSATION_HEADER} header")
        s = self.sessions.get(key)
        if s is None or s.closed:
            raise ApiError(404, f"conversation {key[:8]}... is unknown or has ended", "conversation_not_found")
        return s

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "object": "list",
                "data": [{"id": self.model_name, "object": "model", "created": 0, "owned_by": "agentgym"}],
            }
        )

    async def _reward(self, request: web.Request) -> web.Response:
        s = self._session(request)
        body = await _json(request)
        reward = body.get("reward")
        if (
            isinstance(reward, bool)
            or not isinstance(reward, (int, float))
            or reward != reward
            or abs(reward) == float("inf")
        ):
            raise ApiError(400, f"reward must be a finite number, got {reward!r}")
        s.reward = float(reward)
        if isinstance(body.get("success"), bool):
            s.success = body["success"]
        return web.json_response({"ok": True})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await _json(request)
        s = self._session(request, body)
        if body.get("n", 1) != 1:
            raise ApiError(400, f"n must be 1, got {body.get('n')!r}")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise ApiError(400, "messages must be a non-empty list of message objects")
        tools = body.get("tools") or None
        asked = body.get("max_completion_tokens") or body.get("max_tokens")
        if asked is not None and (not isinstance(asked, int) or asked < 1):
            raise ApiError(400, f"max_tokens must be a positive integer, got {asked!r}")
        async with s.lock:
            if s.closed:
                raise ApiError(404, "the conversation has ended", "conversation_not_found")
            if s.limit:
                raise ApiError(400, f"the episode ended at its {s.limit.replace('_', ' ')}", s.limit)
            if s.calls >= s.turn_limit:
                s.limit = "turn_limit"
                raise ApiError(400, f"turn limit reached: {s.turn_limit} calls", "turn_limit")
            try:
                plan = s.trace.plan([_message(m) for m in messages], tools)
            except BudgetExceeded as exc:
                s.limit = "token_limit"
                raise ApiError(400, f"token budget spent: {exc}", "token_limit") from exc
            except Exception as exc:  # noqa: BLE001 - a template that cannot render these messages
                raise ApiError(400, f"the chat template cannot render these messages: {exc}") from exc
            spec = replace(s.sampling, max_tokens=max(1, min(s.max_tokens, asked or s.max_tokens, s.trace.room(plan))))
            temp = body.get("temperature")
            if self.request_temperature and isinstance(temp, (int, float)) and temp > 0:
                spec = replace(spec, temperature=float(temp), top_p=float(body.get("top_p") or 1.0))
            gen = await self.engine.generate(f"agent/{s.name or s.key}/{s.calls}", plan.prompt_ids, spec)
            if gen.finish_reason == "abort" or s.closed:
                raise ApiError(503, "the actor is stopping", "unavailable")
            text = s.trace.record(plan, gen)
        message, finish = _assistant(text, gen.finish_reason, bool(tools))
        n_prompt, n_gen = len(plan.prompt_ids), len(gen.token_ids)
        head = {"id": f"chatcmpl-{s.key[:8]}-{s.calls}", "created": int(time.time()), "model": self.model_name}
        usage = {"prompt_tokens": n_prompt, "completion_tokens": n_gen, "total_tokens": n_prompt + n_gen}
        if body.get("stream"):
            options = body.get("stream_options")
            return await _stream(
                request,
                head,
                message,
                finish,
                usage if isinstance(options, dict) and options.get("include_usage") else None,
            )
        return web.json_response(
            {
                **head,
                "object": "chat.completion",
                "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
                "usage": usage,
            }
        )


async def _stream(
    request: web.Request, head: dict[str, Any], message: dict[str, Any], finish: str, usage: dict[str, int] | None
) -> web.StreamResponse:
    """A finished completion as chat.completion.chunk server-sent events."""
    delta = {k: v for k, v in message.items() if k != "tool_calls"}
    if message.get("tool_calls"):
        delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(message["tool_calls"])]
    chunk = {**head, "object": "chat.completion.chunk"}
    events = [
        {**chunk, "choices": [{"index": 0, "delta": delta, "finish_reason": None, "logprobs": None}]},
        {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": finish, "logprobs": None}]},
    ]
    if usage is not None:
        events.append({**chunk, "choices": [], "usage": usage})
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    for event in events:
        await response.write(f"data: {json.dumps(event)}\n\n".encode())
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


def _error(exc: ApiError) -> web.Response:
    return web.json_response({"error": {"message": exc.message, "type": exc.code, "code": exc.code}}, status=exc.status)


async def _json(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"the body is not JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object")
    return body


def _message(m: dict[str, Any]) -> dict[str, Any]:
    """A chat message as HF chat templates take it: text parts joined, content never None, tool
    call arguments as objects (the SDK sends them as JSON strings)."""
    out = dict(m)
    content = out.get("content")
    if isinstance(content, list):
        out["content"] = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    elif content is None:
        out["content"] = ""
    calls = out.get("tool_calls")
    if isinstance(calls, list):
        fixed = []
        for c in calls:
            fn = dict(c.get("function") or {}) if isinstance(c, dict) else {}
            if isinstance(fn.get("arguments"), str):
                try:
                    fn["arguments"] = json.loads(fn["arguments"])
                except json.JSONDecodeError:
                    pass
            fixed.append({**c, "function": fn} if isinstance(c, dict) else c)
        out["tool_calls"] = fixed
    return out


def _assistant(text: str, finish: str, tools: bool) -> tuple[dict[str, Any], str]:
    """The assistant message of a completion; with tools, ``<tool_call>{json}</tool_call>`` blocks
    (the Hermes / Qwen format) become ``tool_calls``."""
    calls = []
    if tools:
        for i, m in enumerate(_TOOL_CALL.finditer(text)):
            try:
                obj = json.loads(m.group(1))
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict) and isinstance(obj.get("name"), str):
                args = obj.get("arguments", {})
                calls.append(
                    {
                        "id": f"call_{i}",
                        "type": "function",
                        "function": {
                            "name": obj["name"],
                            "arguments": args if isinstance(args, str) else json.dumps(args),
                        },
                    }
                )
    if not calls:
        return {"role": "assistant", "content": text}, finish
    rest = _TOOL_CALL.sub("", text).strip()
    return {"role": "assistant", "content": rest or None, "tool_calls": calls}, "tool_calls"
