"""Where a model is: the one rule the learner, the actor and ``agentgym eval`` follow.

    path = find_model("Qwen/Qwen2.5-0.5B-Instruct", "model.path")   # the snapshot in the HF cache
    path = find_model("models/tiny", "--model")                       # a local HF directory
    cfg = with_model_found(cfg, "model.path")                          # the config, path resolved

A model is a local Hugging Face directory (``config.json``, weights, tokenizer) or a hub id
(``ORG/NAME``) already in the local hub cache (``HF_HUB_CACHE``, by default
``~/.cache/huggingface/hub``). Nothing is downloaded: a run that would fetch gigabytes, retry the
hub and die with a traceback deep in ``from_pretrained`` stops instead, before anything loads,
with one line saying how to download the model. The check imports ``huggingface_hub`` only (no
torch), so it runs right after the config is parsed.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")  # ORG/NAME, as the hub spells repository ids


class ModelNotFound(ValueError):
    """The model is neither a local HF directory nor in the hub cache; the message says how to get it."""


def find_model(value: str | Path, key: str) -> Path:
    """The local directory of the model named by ``value`` (the config key or flag ``key`` set it):
    ``value`` itself when it holds ``config.json``, else the hub cache's snapshot of hub id
    ``value``; ``ModelNotFound`` (one line, with the download command) otherwise."""
    text = str(value)
    path = Path(text).expanduser()
    if (path / "config.json").is_file():
        return path
    if path.is_dir():
        raise ModelNotFound(f"{key} {text}: a directory without config.json, not a Hugging Face model directory")
    if path.exists():
        raise ModelNotFound(f"{key} {text}: a file, not a Hugging Face model directory")
    if _HUB_ID.match(text) and not text.startswith((".", "~")):
        snapshot = _cached_snapshot(text)
        if snapshot is not None:
            return snapshot
    if not _HUB_ID.match(text):
        raise ModelNotFound(
            f"{key} {text}: no such directory; expected a local Hugging Face model directory "
            "(with config.json) or a hub id ORG/NAME already in the local Hugging Face cache"
        )
    name = text.rsplit("/", 1)[-1]
    raise ModelNotFound(
        f"{key} {text}: no model directory there and no hub model {text!r} in the local Hugging Face "
        f"cache; download it first: hf download {text} --local-dir models/{name} "
        f"(then {key} models/{name})"
    )


def _cached_snapshot(repo_id: str) -> Path | None:
    """The cached snapshot of ``repo_id`` with a config.json, without touching the network."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        found = Path(snapshot_download(repo_id, local_files_only=True))
    except (LocalEntryNotFoundError, HFValidationError, OSError, ValueError):
        return None
    return found if (found / "config.json").is_file() else None


def with_model_found(cfg: Any, key: str = "model.path") -> Any:
    """``cfg`` with ``model.path`` replaced by the directory ``find_model`` finds. A model the run
    makes itself (``model.create_tiny`` or ``model.make_from``, and nothing there yet) is left to
    ``ensure_model``."""
    path = Path(cfg.model.path)
    if (cfg.model.create_tiny or cfg.model.make_from) and not path.exists():
        return cfg
    found = find_model(cfg.model.path, key)
    if found == path:
        return cfg
    return cfg.model_copy(update={"model": cfg.model.model_copy(update={"path": found})})
