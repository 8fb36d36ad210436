"""Environment names -> classes, resolved lazily by import path.

    register_env("coin", "my_pkg.coin:Coin")
    cls = resolve_env("coin")          # imports my_pkg.coin, checks Coin is an Env
    known_envs()                       # ["chaos", "coin", "guess_number"]
    check_env("coin", {"sides": 3})    # a config's env name and options, checked at start-up
    env_target("my_pkg.coin:Coin")     # a config may name the class itself

Registration stores only the ``"module.path:ClassName"`` string: naming an env costs no import,
so the actor can validate a config without loading an env's dependencies (a JVM, a browser),
and the pool hands the string to its worker subprocesses, where the import happens.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Mapping

from agentgym.envpool.base import Env

_TARGET = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_REGISTRY: dict[str, str] = {}


class UnknownEnvError(ValueError):
    """An env name that nothing registered."""

    def __init__(self, name: str, where: str = "") -> None:
        known = ", ".join(known_envs()) or "(none)"
        origin = f" (from {where})" if where else ""
        super().__init__(f"unknown environment {name!r}{origin}; known environments: {known}")
        self.name = name


def register_env(name: str, target: str) -> None:
    """Register ``name`` as ``target`` (``"module.path:ClassName"``). Re-registering the same pair
    is a no-op; registering a name again with another target is an error (two envs, one name)."""
    if not name or not name.replace("_", "").replace("-", "").isalnum():
        raise ValueError(f"register_env: env name must be letters, digits, '_' or '-', got {name!r}")
    if not _TARGET.match(target):
        raise ValueError(f"register_env({name!r}): target must be 'module.path:ClassName', got {target!r}")
    old = _REGISTRY.get(name)
    if old is not None and old != target:
        raise ValueError(f"register_env: {name!r} is already registered as {old!r}, not {target!r}")
    _REGISTRY[name] = target


ENTRY_POINT_GROUP = "agentgym.envs"
"""Packages register envs without an edit here: ``[project.entry-points."agentgym.envs"]``
``coin = "my_pkg.coin:Coin"`` in their pyproject.toml."""


def _entry_points() -> dict[str, str]:
    from importlib.metadata import entry_points

    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def env_target(name: str, where: str = "") -> str:
    """The import path for ``name`` (no import): a registered name, a package's entry point in
    ``agentgym.envs``, or ``"module.path:ClassName"`` itself; ``UnknownEnvError`` if none."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    if _TARGET.match(name):
        return name
    target = _entry_points().get(name)
    if target is None or not _TARGET.match(target):
        raise UnknownEnvError(name, where)
    return target


def load_target(target: str, name: str = "") -> type[Env]:
    """Import ``"module.path:ClassName"`` and check that it is an ``Env`` subclass."""
    module_name, _, attr = target.partition(":")
    label = f"env {name!r} ({target})" if name else f"env class {target!r}"
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ImportError(f"{label}: cannot import module {module_name!r}: {exc}") from exc
    cls = getattr(module, attr, None)
    if not (isinstance(cls, type) and issubclass(cls, Env)):
        raise TypeError(f"{label}: {module_name}.{attr} is {cls!r}, not a subclass of agentgym Env")
    return cls


def resolve_env(name: str) -> type[Env]:
    """The env class registered as ``name`` (imports its module)."""
    return load_target(env_target(name), name)


def known_envs() -> list[str]:
    """Registered env names and those of installed packages' entry points, sorted."""
    return sorted(set(_REGISTRY) | set(_entry_points()))


# Built-ins. Test-only envs are registered too: a pool can be pointed at them from a config.
register_env("guess_number", "agentgym.envpool.envs.guess_number:GuessNumber")
register_env("chaos", "agentgym.envpool.envs.chaos:Chaos")
register_env("sciworld", "agentgym.envpool.envs.sciworld:SciWorld")
register_env("deepsearch", "agentgym.envpool.envs.deepsearch:DeepSearch")
register_env("remote", "agentgym.envpool.envs.remote:Remote")
register_env("webshop", "agentgym.envpool.envs.webshop.env:WebShop")
register_env("babyai", "agentgym.envpool.envs.babyai:BabyAI")
register_env("textcraft", "agentgym.envpool.envs.textcraft:TextCraft")
register_env("maze", "agentgym.envpool.envs.maze:Maze")
register_env("wordle", "agentgym.envpool.envs.wordle:Wordle")
register_env("probe", "agentgym.envpool.envs.probe:Probe")
# Adapters for other ecosystems' env packages (optional extras; docs/environments.md, "Bring an environment from ...").
register_env("reasoning_gym", "agentgym.envpool.envs.reasoning_gym:ReasoningGym")
register_env("textarena", "agentgym.envpool.envs.textarena:TextArena")
register_env("skyrl_gym", "agentgym.envpool.envs.skyrl_gym:SkyRLGym")
register_env("verifiers", "agentgym.envpool.envs.verifiers_env:Verifiers")
register_env("openenv", "agentgym.envpool.envs.openenv_env:OpenEnv")

ENV_INFO: dict[str, tuple[str, str, bool]] = {
    # name: (what it is, what it needs beyond the Python packages, test-only)
    "guess_number": ("find a hidden number from higher/lower hints (the quickstart's task)", "-", False),
    "maze": ("walk a grid maze from start to goal (after lmrlgym's maze)", "-", False),
    "wordle": ("find a hidden word from per-letter feedback", "Debian wamerican (word list)", False),
    "textcraft": ("craft a goal item from raw materials by a recipe book", "-", False),
    "babyai": ("BabyAI grid levels in text (PyPI minigrid)", "-", False),
    "deepsearch": ("answer questions by searching a BM25 index of the CIA World Factbook", "-", False),
    "sciworld": ("ScienceWorld's 30 science tasks (a JVM simulator)", "Java 17 (openjdk-17-jre-headless)", False),
    "webshop": (
        "buy the product an instruction describes on a local web shop, in a browser",
        "Chromium (Debian chromium)",
        False,
    ),
    "remote": (
        "an env played on a remote AgentGym env server over HTTP",
        "a running env server (env.kwargs.url)",
        False,
    ),
    "probe": ("one-turn diagnostics: can the learner learn one given thing", "-", False),
    "reasoning_gym": (
        "any reasoning-gym dataset by name, scored by its score_answer",
        "agentgym[reasoning-gym]",
        False,
    ),
    "textarena": ("any TextArena game by id; two-player games against a fixed opponent", "agentgym[textarena]", False),
    "skyrl_gym": ("any registered SkyRL-gym env id, on SkyRL-format rows (JSON Lines)", "agentgym[skyrl-gym]", False),
    "verifiers": (
        "a verifiers (prime-rl) taskset, played by its own harness through the agent endpoint",
        "pip extra [verifiers]; uv fetches the harness program's packages on first use",
        False,
    ),
    "openenv": (
        "an OpenEnv Environment class by 'module:Class', played in-process (no server, no Docker)",
        "agentgym[openenv] (scripts/install.sh: without gradio)",
        False,
    ),
    "chaos": ("an env that crashes, hangs or corrupts on request (pool robustness tests)", "-", True),
}
"""What ``agentgym envs`` prints for each built-in (docs/environments.md has the details)."""


class EnvOptionsError(ValueError):
    """A config's env options that its env refuses: one line naming the config key, the env and
    what was wrong (``env.kwargs: env maze: unknown option(s) ['sise']; ...``)."""


def check_env(name: str, options: Mapping[str, object], where: str = "env") -> type[Env]:
    """The start-up check of a config's env, the one path every env's options go through: the
    name through the registry (``UnknownEnvError``, naming ``{where}.name``), then the class's
    ``check_options`` (its module is imported; an adapter's package only if its check needs it).
    A refusal is an ``EnvOptionsError`` of one line: ``{where}.kwargs: env NAME: what``. Returns
    the class."""
    cls = load_target(env_target(name, f"{where}.name"), name)
    try:
        cls.check_options(**dict(options))
    except (ValueError, TypeError, ImportError) as exc:
        text = " ".join(str(exc).split()) or type(exc).__name__
        if not text.startswith("env "):  # the env's own messages name it; others get its name
            text = f"env {name}: {text}"
        raise EnvOptionsError(f"{where}.kwargs: {text}") from None
    return cls


def describe_envs() -> list[tuple[str, str, str, bool]]:
    """(name, description, system needs, test-only) of every known env; an env from a package's
    entry point is described by its import path (describing it would mean importing it)."""
    plugins = _entry_points()  # as written, unchecked: listing must not fail on one package's typo
    return [
        (n, *ENV_INFO.get(n, (f"from an installed package: {plugins.get(n, _REGISTRY.get(n))}", "?", False)))
        for n in known_envs()
    ]
