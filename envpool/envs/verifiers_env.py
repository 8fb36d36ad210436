"""verifiers environments (pip ``verifiers`` 0.4.0, ``verifiers.v1``), played by verifiers itself
through the actor's agent endpoint (docs/agents.md; docs/adr/0022-verifiers-environments.md).

    [env]
    name = "verifiers"
    kwargs = { "taskset.id" = "verifiers_say", "taskset.size" = 16, python_path = ["examples"] }

    [actor.agent_endpoint]
    enabled = true
    program = "agentgym.envpool.envs.verifiers_env:play"

A dotted option is verifiers' own env config, as its CLI spells it (``vf eval --env.taskset.id X``
is ``"taskset.id" = "X"``): ``taskset.*`` names the taskset module and its config, ``agent.harness.*``
the harness program (default ``null``, verifiers' chat loop with the taskset's tools),
``agent.runtime.type`` where it runs (default ``subprocess``: on the actor's host), ``id`` an
``Env`` subclass. Options of the adapter itself: ``test_fraction`` (default 0.1; every k-th task,
k = round(1 / test_fraction), is a dev/test task, the rest train), ``max_tasks`` (bound an infinite
taskset) and ``python_path`` (directories put on ``sys.path`` before the taskset is imported).

The task id of a training ticket picks ``train[id % len(train)]`` of the taskset's order. ``play``
is the agent program the actor's ``AgentRunner`` calls per episode: it runs the verifiers env's
episode (``Env.run_slot``: harness program, interception, tools, ``@vf.reward`` scoring) in one
event loop per actor process, with the env served once, its model calls sent to the episode's
conversation on the endpoint; the endpoint records them token-exact and the rubric's reward,
returned here, is what is trained. ``Verifiers.check_options`` (loading the taskset) and
``agent_program`` (the endpoint the run must enable) are its start-up check, through
``registry.check_env`` as every env's.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import re
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentgym.envpool.base import SPLITS, Env, StepResult

PROGRAM = "agentgym.envpool.envs.verifiers_env:play"
EXTRA = "pip install -e '.[verifiers]'"
_OWN = {"test_fraction", "max_tasks", "python_path"}
_KEY_VAR = "AGENTGYM_VERIFIERS_API_KEY"
_DEFAULTS = {"agent": {"harness": {"id": "null"}, "runtime": {"type": "subprocess"}}}
_CONVERSATION = re.compile(r"^(?P<root>.+)/c/(?P<key>[0-9a-f]+)/v1/?$")


class VerifiersError(ValueError):
    """A verifiers env that cannot be set up from its options (one line, naming what was wrong)."""


def _vf() -> Any:
    try:
        import verifiers.v1 as vf
    except ImportError as exc:
        raise ImportError(f"env verifiers needs the verifiers package ({exc}): {EXTRA}") from None
    return vf


def env_config(options: dict[str, Any]) -> dict[str, Any]:
    """verifiers' env config (nested) from the dotted options, with the adapter's defaults."""
    unknown = sorted(k for k in options if "." not in k and k not in _OWN and k != "id")
    if unknown:
        raise VerifiersError(
            f"env verifiers: unknown option(s) {unknown}: verifiers' own are dotted "
            f'("taskset.id", "agent.harness.id"), the adapter\'s are {sorted(_OWN)}'
        )
    out: dict[str, Any] = json.loads(json.dumps(_DEFAULTS))
    for key, value in options.items():
        if key in _OWN:
            continue
        *path, last = key.split(".")
        node = out
        for part in path:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise VerifiersError(f"env verifiers: option {key!r} puts a field under {part!r}, which is a value")
        node[last] = value
    if not isinstance(out.get("taskset"), dict) or not out["taskset"].get("id"):
        raise VerifiersError('env verifiers: set "taskset.id" (the taskset module\'s name) in env.kwargs')
    return out


def _missing_taskset(taskset_id: str) -> VerifiersError | None:
    """A one-line error for a taskset id that names no importable module (as verifiers resolves
    it: ``verifiers.v1.tasksets.<id>`` first, then ``<id>``), listing verifiers' built-in ones;
    None where the module is there."""
    import difflib
    import importlib.util
    import pkgutil

    module = str(taskset_id).rsplit("/", 1)[-1].split("@", 1)[0].replace("-", "_").lower()
    for target in (f"verifiers.v1.tasksets.{module}", module):
        try:
            if importlib.util.find_spec(target) is not None:
                return None
        except (ImportError, ValueError):  # a dotted id whose parent package is not there
            pass
    from verifiers.v1 import tasksets

    builtin = sorted(m.name for m in pkgutil.iter_modules(tasksets.__path__))
    close = difflib.get_close_matches(module, builtin, n=3)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    return VerifiersError(
        f"env verifiers: unknown taskset {taskset_id!r}{hint}: no module {module!r} on the import path "
        f"(a taskset module of your own: put its directory in python_path); verifiers' {len(builtin)} "
        f"built-in tasksets: {', '.join(builtin)}"
    )


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class Loaded:
    """One verifiers env of one set of options, its tasks, and its split."""

    def __init__(self, options: dict[str, Any]) -> None:
        vf = _vf()
        from verifiers.v1.utils.loaders import load_environment, resolve_env_config

        config = env_config(options)
        for path in reversed(list(options.get("python_path") or [])):
            path = str(Path(path).resolve())
            if path not in sys.path:
                sys.path.insert(0, path)
        taskset_id = config["taskset"]["id"]
        missing = _missing_taskset(taskset_id)
        if missing is not None:
            raise missing
        try:
            self.env = load_environment(resolve_env_config(config))
            taskset = self.env.taskset
            if options.get("max_tasks"):
                taskset = taskset.take(int(options["max_tasks"]))
            if not taskset.bounded:
                raise VerifiersError("the taskset is infinite: bound it with the option max_tasks")
            self.tasks = list(taskset)
        except VerifiersError as exc:
            raise VerifiersError(f"env verifiers: taskset {taskset_id!r}: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - whatever loading raised, as one line naming the taskset
            raise VerifiersError(f"env verifiers: cannot load taskset {taskset_id!r}: {_one_line(exc)}") from None
        fraction = float(options.get("test_fraction", 0.1))
        if not 0 < fraction < 1:
            raise VerifiersError(f"env verifiers: test_fraction must be between 0 and 1, got {fraction}")
        k = max(2, round(1 / fraction))
        ids = range(len(self.tasks))
        self.splits = {"train": [i for i in ids if i % k != k - 1], "test": [i for i in ids if i % k == k - 1]}
        self.splits["dev"] = self.splits["test"]
        if not self.splits["train"] or not self.splits["test"]:
            raise VerifiersError(
                f"env verifiers: taskset {taskset_id!r} has {len(self.tasks)} task(s): "
                f"too few for a train and a test split at test_fraction {fraction}"
            )
        self.vf = vf
        self.served = False


_loaded: dict[str, Loaded] = {}
_lock = threading.Lock()


def load(options: dict[str, Any]) -> Loaded:
    """The env of these options, loaded once per process."""
    key = json.dumps(options, sort_keys=True)
    with _lock:
        if key not in _loaded:
            _loaded[key] = Loaded(options)
        return _loaded[key]


class _Loop:
    """The event loop verifiers' envs, their interception servers and episodes live in (one
    thread per actor process; the agent threads wait on it)."""

    def __init__(self) -> None:
        # verifiers runs harness programs with uv from PATH (else it pip-installs one into ~/.local):
        # the extra's own uv sits beside this interpreter, where PATH may not look.
        bindir = str(Path(sys.executable).parent)
        if (Path(bindir) / "uv").exists() and bindir not in os.environ.get("PATH", "").split(os.pathsep):
            os.environ["PATH"] = os.pathsep.join(filter(None, [bindir, os.environ.get("PATH")]))
        self.loop = asyncio.new_event_loop()
        self.stack = contextlib.AsyncExitStack()
        self.serving = asyncio.Lock()
        threading.Thread(target=self.loop.run_forever, name="verifiers", daemon=True).start()
        atexit.register(self.close)

    def close(self) -> None:
        """Stop what serving started (interception servers, shared tool servers) as the actor exits."""
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self.stack.aclose(), self.loop).result(timeout=10)

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()


_loop: _Loop | None = None


def _the_loop() -> _Loop:
    global _loop
    with _lock:
        if _loop is None:
            _loop = _Loop()
        return _loop


async def _episode(env: Loaded, loop: _Loop, index: int, root: str, key: str, model: str) -> dict[str, Any]:
    vf = env.vf
    async with loop.serving:
        if not env.served:  # served once: the interception server and shared tools outlive episodes
            await loop.stack.enter_async_context(env.env.serving())
            env.served = True
    # One client config for every episode (the interception keeps one HTTP client per config);
    # the conversation rides in a body field the endpoint routes on.
    ctx = vf.ModelContext(
        model=model,
        client=vf.EvalClientConfig(base_url=f"{root}/v1", api_key_var=_KEY_VAR),
        sampling=vf.SamplingConfig(agentgym_conversation=key),
    )
    task = env.tasks[index]
    episode = await env.env.run_slot(env.env.slots(task, 1)[0], ctx)
    if not episode.ok:
        errors = [e for t in episode.traces for e in t.errors] + list(episode.errors)
        raise RuntimeError(
            f"verifiers episode failed: {errors[-1].type}: {' '.join(errors[-1].message.split())[:800]}"
            if errors
            else "verifiers episode failed"
        )
    reward = float(sum(t.reward for t in episode.traces))
    # done: the harness ended the episode (a call refused at a limit never gets here: it fails the
    # harness, and the runner keeps the limit's truncation)
    return {"reward": reward, "success": reward > 0, "done": True}


def play(task: dict[str, Any], client: Any) -> dict[str, Any]:
    """The agent program (``actor.agent_endpoint.program``): one episode of the ticket's task,
    played by verifiers against the conversation ``client`` is bound to; returns the rubric's reward."""
    options = dict(task.get("options") or {})
    env = load(options)
    m = _CONVERSATION.match(str(client.base_url))
    if m is None:
        raise RuntimeError(f"env verifiers: the client's base URL {client.base_url} names no conversation")
    os.environ[_KEY_VAR] = client.api_key  # read by verifiers' client config (never passed to the harness)
    ids = env.splits["train"] if task["split"] == "train" else list(range(len(env.tasks)))
    index = ids[int(task["task_id"]) % len(ids)]
    return _the_loop().run(_episode(env, _the_loop(), index, m["root"], m["key"], "policy"))


class Verifiers(Env):
    """The registry's view of a verifiers env: its task ids by split. Its episodes are verifiers'
    own (``play``), so an env worker never plays it."""

    name = "verifiers"
    replayable = False
    agent_program = PROGRAM

    def __init__(self, **kwargs: object) -> None:
        raise RuntimeError(
            "env verifiers is played by verifiers' harness through the agent endpoint: set "
            f"actor.agent_endpoint.enabled = true and program = {PROGRAM!r}"
        )

    @classmethod
    def check_options(cls, **options: object) -> None:
        """The package is installed, the taskset loads and splits (``ImportError`` /
        ``VerifiersError``, one line); loaded once per process, as the episodes use it."""
        load(dict(options))

    @classmethod
    def tasks(cls, split: str = "train", **options: object) -> Sequence[int]:
        if split not in SPLITS:
            raise ValueError(f"env verifiers: unknown split {split!r}; splits are {list(SPLITS)}")
        return load(dict(options)).splits[split]

    def reset(self, task_id: int) -> str:
        raise NotImplementedError

    def step(self, action: str) -> StepResult:
        raise NotImplementedError

    def expert_action(self) -> str:
        raise NotImplementedError
