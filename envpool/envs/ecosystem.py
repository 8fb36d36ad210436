"""Shared pieces of the adapters for other ecosystems' env packages (``reasoning_gym``,
``textarena``, ``skyrl_gym``): the lazy import that names the extra to install, the one-line
error for an unknown id, and the split of a task id.

    rg = require("reasoning_gym", "reasoning-gym", env="reasoning_gym")   # ImportError names the extra
    unknown("reasoning_gym", "dataset", "leg_countin", DATASETS)          # ValueError listing them all

The packages are optional extras of agentgym (``pip install 'agentgym[envs]'``); only these env
modules import them, and only inside functions, so naming an env, validating a config and the
training path never import them (the import-linter contract in pyproject.toml).
"""

from __future__ import annotations

import difflib
import importlib
import re
from collections.abc import Iterable
from types import ModuleType

from agentgym.envpool.base import _PROCEDURAL

TEST_START = _PROCEDURAL["test"].start
"""Task ids of a test split start here (the procedural envs' test range), train ids at 0, so the
two never meet and ``split_of`` names a task's split."""


def require(module: str, extra: str, env: str) -> ModuleType:
    """Import ``module`` or raise an ImportError that names the agentgym extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"env {env} needs the package of the '{extra}' extra: pip install 'agentgym[{extra}]' ({exc})"
        ) from None


def unknown(env: str, kind: str, name: object, known: Iterable[str]) -> ValueError:
    """A one-line error for an unknown id: the closest matches first, then every id there is."""
    names = sorted(known)
    close = difflib.get_close_matches(str(name), names, n=3)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    return ValueError(f"env {env}: unknown {kind} {name!r}{hint}; the {len(names)} {kind}s: {', '.join(names)}")


def split_index(env: str, task_id: int, train: int, test: int) -> tuple[str, int]:
    """(split, index into it) of ``task_id``: ids below 2**30 are training ids and wrap onto the
    ``train`` items (a config's default ``task_count`` is a million), ids from ``TEST_START`` on
    are the test items in order; there is no dev split."""
    if task_id >= TEST_START:
        index = task_id - TEST_START
        if index >= test:
            raise ValueError(f"env {env}: task {task_id} is test item {index}, but the test split has {test}")
        return "test", index
    if task_id >= _PROCEDURAL["dev"].start:
        raise ValueError(f"env {env}: task {task_id} is in the dev range; this env has train and test splits only")
    if train < 1:
        raise ValueError(f"env {env}: task {task_id} is a training task, but the train split is empty")
    return "train", task_id % train


def one_line(text: object, limit: int = 300) -> str:
    """``text`` on one line, cut to ``limit`` characters (for error messages quoting env output)."""
    flat = " ".join(re.sub(r"\*{5,}", " ", str(text)).split())  # NLTK frames its errors in asterisks
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."
