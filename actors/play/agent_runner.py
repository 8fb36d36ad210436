"""Plays a ticket's episodes with the user's own agent program through the agent endpoint.

    runner = AgentRunner(cfg.actor.agent_endpoint, engine, tokenizer, stats=actor.stats)
    await runner.start()                                   # the endpoint (actors/play/agent_endpoint.py)
    if runner.plays(ticket.env):
        episode = await runner.play(ticket, index, spec, turn_limit)
    await runner.close()

The agent is ``module:function`` (or ``path/file.py:function``), called in a worker thread as
``function(task, client) -> reward`` with an ``openai.OpenAI`` client whose base URL names the
episode's conversation; or a command, run with OPENAI_BASE_URL / OPENAI_API_KEY / AGENTGYM_TASK
in its environment, whose reward is the last line of its stdout or a POST to ``{base_url}/reward``.
``task`` is a dict: env, task_id (the env's task id; evaluation tickets are resolved to one),
split, group_id, index, max_calls (the turn limit), max_tokens_per_call and the env's options.
A reward may be a number or ``{"reward": x, "success": bool}`` (success defaults to reward > 0);
``"done": true`` in it says the agent ended the episode itself, so an unsuccessful episode that
used every call is not taken for one cut at the turn limit.

An agent that raises, exits non-zero, gives no reward or runs past ``timeout_s`` costs its episode
only: it becomes ``finish="env_failure"`` (counted by the learner as env-worker failures are, and
here as ``agent_failures``). An agent that fails after a call was refused at the turn limit or
token budget ended its episode there, which trains as that truncation. A timed-out thread cannot
be killed: its conversation is closed, so its next call fails and it ends; a command's process
group is killed.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import json
import math
import os
import signal
import sys
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import structlog

from agentgym.actors.engines.engine import InferenceEngine, SamplingSpec
from agentgym.actors.play.agent_endpoint import AgentEndpoint, Session
from agentgym.actors.play.agent_trace import AgentTrace
from agentgym.config.actor import AgentEndpointConfig
from agentgym.envpool.registry import env_target, load_target
from agentgym.protocol import Episode, RolloutSpec, Ticket
from agentgym.protocol.vocab import banned_action_ids

log = structlog.get_logger(__name__)


class AgentFailed(Exception):
    """The agent program ended without a usable reward."""


def load_program(target: str) -> Callable[[dict[str, Any], Any], Any]:
    """Import ``module:function`` or ``path/to/file.py:function``."""
    module_name, _, attr = target.rpartition(":")
    try:
        if module_name.endswith(".py"):
            path = Path(module_name).resolve()
            spec = importlib.util.spec_from_file_location(f"agentgym_agent_{path.stem}", path)
            if spec is None or spec.loader is None:
                raise ImportError(f"no Python file at {path}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except (ImportError, OSError) as exc:
        raise ImportError(f"actor.agent_endpoint.program: cannot import {module_name!r}: {exc}") from exc
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ImportError(f"actor.agent_endpoint.program: {module_name!r} has no callable {attr!r}")
    return fn


def _shared_http(openai: Any) -> Any:
    """The SDK's default HTTP client, shared by the agents: an agent that closes its own client
    (``with client: ...``) leaves it open for the others."""

    class SharedHttp(openai.DefaultHttpxClient):
        def close(self) -> None:
            pass

        def close_pool(self) -> None:
            super().close()

    return SharedHttp()


def _reward(value: Any) -> tuple[float, bool | None]:
    success = None
    if isinstance(value, dict):
        value, success = value.get("reward"), value.get("success")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise AgentFailed(f"the agent returned {value!r}, not a finite reward")
    return float(value), success if isinstance(success, bool) else None


class AgentRunner:
    def __init__(
        self,
        cfg: AgentEndpointConfig,
        engine: InferenceEngine,
        tokenizer: Any,
        stats: dict[str, int] | None = None,
        max_request_bytes: int = 64 * 2**20,
    ) -> None:
        self.cfg = cfg
        token = os.environ.get(cfg.token_env, "") if cfg.token_env else ""
        if cfg.token_env and not token:
            raise ValueError(
                f"actor.agent_endpoint.token_env: environment variable {cfg.token_env!r} is empty or unset"
            )
        self.api_key = token or "agentgym"  # the SDK insists on some key
        self.endpoint = AgentEndpoint(
            engine,
            tokenizer,
            host=cfg.host,
            port=cfg.port,
            token=token,
            model_name=cfg.model_name,
            request_temperature=cfg.request_temperature,
            max_request_bytes=max_request_bytes,
        )
        self.tokenizer = tokenizer
        self.engine = engine
        self.program = load_program(cfg.program) if cfg.program else None
        self.threads = ThreadPoolExecutor(cfg.max_agents, thread_name_prefix="agent") if self.program else None
        self.slots = asyncio.Semaphore(cfg.max_agents)
        self.stats = stats if stats is not None else {}
        self._tasks: dict[tuple[str, str], Any] = {}
        self._http: Any = None
        """One HTTP connection pool for every agent's client: an ``openai.OpenAI`` of its own builds
        an SSL context, tens of ms of CPU per episode."""

    async def start(self) -> None:
        await self.endpoint.start()

    async def close(self) -> None:
        await self.endpoint.close()
        if self.threads is not None:
            self.threads.shutdown(wait=False, cancel_futures=True)
        if self._http is not None:
            self._http.close_pool()

    def plays(self, env: str) -> bool:
        return not self.cfg.envs or env in self.cfg.envs

    def _count(self, key: str, n: int = 1) -> None:
        self.stats[key] = self.stats.get(key, 0) + n

    def task_id(self, ticket: Ticket, options: dict[str, Any]) -> int:
        """An evaluation ticket's index resolved against the env's split (as EnvPool.task_id)."""
        if ticket.split == "train":
            return ticket.task_id
        key = (ticket.env, ticket.split)
        if key not in self._tasks:
            self._tasks[key] = load_target(env_target(ticket.env), ticket.env).tasks(ticket.split, **options)
        ids = self._tasks[key]
        return int(ids[ticket.task_id % len(ids)])

    async def play(self, ticket: Ticket, index: int, spec: RolloutSpec, turn_limit: int) -> Episode:
        options = dict(spec.env_kwargs.get(ticket.env, {}))
        eos = getattr(self.tokenizer, "eos_token_id", None)
        # The policy the learner scores: without the special tokens unless the run allows them
        # (protocol/vocab.py), or every behaviour logprob would be of another distribution.
        sampling = SamplingSpec(
            max_tokens=spec.max_tokens_per_turn,
            temperature=spec.temperature,
            top_p=spec.top_p,
            stop_token_ids=(eos,) if eos is not None else (),
            banned_token_ids=() if spec.allow_special_tokens else banned_action_ids(self.tokenizer),
        )
        budget = min(spec.max_episode_tokens, getattr(self.engine, "max_model_len", None) or spec.max_episode_tokens)
        session = self.endpoint.open(
            AgentTrace(self.tokenizer, budget),
            sampling,
            turn_limit,
            spec.max_tokens_per_turn,
            name=f"{ticket.group_id}/{index}",
        )
        result: Any = None
        failure = ""
        try:
            task = {
                "env": ticket.env,
                "task_id": self.task_id(ticket, options),
                "split": ticket.split,
                "group_id": ticket.group_id,
                "index": index,
                "max_calls": turn_limit,
                "max_tokens_per_call": spec.max_tokens_per_turn,
                "options": options,
            }
            async with self.slots:
                result = await asyncio.wait_for(self._run(session, task), self.cfg.timeout_s)
        except TimeoutError:
            failure = f"agent_timeout: still running after {self.cfg.timeout_s:g} s"
            self._count("agent_timeouts")
        except Exception as exc:  # noqa: BLE001 - the agent's own error fails its episode only
            failure = f"agent_error: {''.join(traceback.format_exception_only(exc)).strip()}"
        finally:
            self.endpoint.close_session(session)
        trace = session.trace
        self._count("agent_episodes")
        self._count("agent_calls", len(trace.calls))
        self._count("agent_prefix_breaks", trace.prefix_breaks)
        if not failure:
            try:
                if result is None and session.reward is not None:  # reported by HTTP, nothing returned
                    result = {"reward": session.reward, "success": session.success}
                reward, success = _reward(result)
            except AgentFailed as exc:
                failure = f"agent_error: {exc}"
        if failure and session.limit:  # refused at a limit: the episode ended there, not a failure
            reward, success, failure = session.reward or 0.0, session.success, ""
        if failure:
            self._count("agent_failures")
            log.warning(
                "agent_episode_failed",
                group=ticket.group_id,
                index=index,
                task=ticket.task_id,
                calls=len(trace.calls),
                error=failure[:500],
            )
            return trace.to_episode(
                reward=0.0, success=False, finish="env_failure", turn_limit=turn_limit, failure=failure
            )
        success = bool(reward > 0) if success is None else success
        ended = isinstance(result, dict) and result.get("done") is True  # the agent says it finished
        finish = session.limit or (
            "turn_limit" if len(trace.calls) >= turn_limit and not success and not ended else "done"
        )
        return trace.to_episode(reward=reward, success=success, finish=finish, turn_limit=turn_limit)

    async def _run(self, session: Session, task: dict[str, Any]) -> Any:
        url = self.endpoint.base_url(session)
        if self.program is not None:
            import openai  # the optional extra: pip install 'agentgym[agents]'

            if self._http is None:
                self._http = _shared_http(openai)
            client = openai.OpenAI(
                base_url=url, api_key=self.api_key, max_retries=0, timeout=self.cfg.timeout_s, http_client=self._http
            )
            try:
                fut = asyncio.get_running_loop().run_in_executor(self.threads, self.program, task, client)
                return await fut
            finally:
                session.closed = True  # a timed-out thread's next call fails: it ends
        return await self._command(session, task, url)

    async def _command(self, session: Session, task: dict[str, Any], url: str) -> Any:
        env = {**os.environ, "OPENAI_BASE_URL": url, "OPENAI_API_KEY": self.api_key, "AGENTGYM_TASK": json.dumps(task)}
        proc = await asyncio.create_subprocess_exec(
            *self.cfg.command,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            stdin=asyncio.subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            out, err = await proc.communicate()
        except BaseException:  # timed out or the actor stops: the agent and its children go
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            await proc.wait()
            raise
        if proc.returncode != 0:
            raise AgentFailed(f"exit status {proc.returncode}: {err.decode(errors='replace')[-1000:]}")
        if session.reward is not None:
            return {"reward": session.reward, "success": session.success}
        lines = [x for x in out.decode(errors="replace").splitlines() if x.strip()]
        try:
            return float(lines[-1])
        except (IndexError, ValueError) as exc:
            raise AgentFailed("no reward: POST {base_url}/reward or print it as the last line of stdout") from exc
