"""Checkpoint directories: an HF model that transformers and vLLM load, plus the learner's state.

    save_checkpoint(path, model, tokenizer_dir, trainer_state, extra_state[, model_state])
    state, extra = load_checkpoint_files(path, model)      # weights loaded into ``model``
    weights = read_model_weights(path)                     # or just read (a sharded model loads them itself)
    latest_checkpoint(run_dir / "checkpoints"); prune_checkpoints(run_dir / "checkpoints", keep=3)

Layout of ``checkpoints/step_000120/``::

    config.json, generation_config.json, model.safetensors, tokenizer files   # HF / vLLM loadable
    trainer/state.pt          optimizer (keyed by parameter name), PPO's critic (the value head, or
                              the separate value model: learner.value_model), step, version,
                              RNG states (tensors + plain data)
    trainer/extra_state.json  the service's state (turn-limit position, dedupe state, ...), JSON
    trainer/meta.json         what wrote it, for a human

The learner's state sits in a sub-folder so that vLLM, which loads every ``*.safetensors`` of the
top folder, never sees it. ``state.pt`` holds only tensors and plain Python data and is read with
``torch.load(weights_only=True)``: no pickled code. A checkpoint is written to ``<name>.tmp`` and
renamed when complete, so a crash mid-save never leaves a directory that looks whole.
"""

from __future__ import annotations

import json
import random
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentgym.config.registries import ALGORITHMS

STATE_FILE = Path("trainer") / "state.pt"
EXTRA_FILE = Path("trainer") / "extra_state.json"
_TOKENIZER_PREFIXES = ("tokenizer", "special_tokens", "vocab", "merges", "chat_template", "added_tokens")


def rng_state() -> dict[str, Any]:
    """torch (CPU and CUDA), numpy and Python RNG states as tensors and plain data."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, py_state, py_gauss = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(np.asarray(keys).astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "gauss": float(gauss),
        },
        "python": {"version": version, "state": list(py_state), "gauss": py_gauss},
    }


def set_rng_state(s: dict[str, Any]) -> None:
    torch.set_rng_state(s["torch"])
    if s["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])
    n = s["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    p = s["python"]
    random.setstate((p["version"], tuple(p["state"]), p["gauss"]))


def save_checkpoint(
    path: Path,
    model: torch.nn.Module,
    tokenizer_dir: Path | None,
    trainer_state: dict[str, Any],
    extra_state: dict[str, Any],
    model_state: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Write a complete checkpoint directory at ``path`` (replacing one that exists).

    ``model_state``: the full weights when ``model`` does not hold them itself (a sharded model;
    see Trainer.save); None saves ``model``'s own."""
    path = Path(path)
    try:
        extra_json = json.dumps(extra_state, indent=1, sort_keys=True)
    except TypeError as exc:
        raise ValueError(f"save_checkpoint: extra_state must be JSON-serialisable (lists, not sets): {exc}") from None
    tmp = path.with_name(path.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    model.save_pretrained(
        tmp, safe_serialization=True, **({"state_dict": model_state} if model_state is not None else {})
    )  # type: ignore[operator]  # an HF (or peft) model's method, past torch.nn.Module's __getattr__
    if tokenizer_dir is not None:
        for f in Path(tokenizer_dir).iterdir():
            if f.is_file() and f.name.startswith(_TOKENIZER_PREFIXES):
                shutil.copy(f, tmp / f.name)
    (tmp / "trainer").mkdir()
    torch.save(trainer_state, tmp / STATE_FILE)
    (tmp / EXTRA_FILE).write_text(extra_json)
    meta = {"step": trainer_state.get("step"), "version": trainer_state.get("version"), "time": time.time()}
    (tmp / "trainer" / "meta.json").write_text(json.dumps(meta))
    if path.exists():
        shutil.rmtree(path)
    tmp.rename(path)
    return path


def read_model_weights(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of ``path``'s safetensors files (one file, or the shards of an index), on CPU."""
    from safetensors.torch import load_file

    path = Path(path)
    index = path / "model.safetensors.index.json"
    files = (
        sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else ["model.safetensors"]
    )
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(path / f)))
    return state


def tied_groups(model: torch.nn.Module) -> list[set[str]]:
    """Names that share one parameter (tied embeddings), a set per shared parameter."""
    by_param: dict[int, set[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        by_param.setdefault(id(p), set()).add(name)
    return [names for names in by_param.values() if len(names) > 1]


def check_loaded(
    path: Path, state: dict[str, torch.Tensor], missing: list[str], unexpected: list[str], tied: list[set[str]]
) -> None:
    """Raise unless ``state`` covered the model: save_pretrained writes a tied weight once, so a
    missing name is fine when another name of its tie group was loaded."""
    missing = [k for k in missing if not any(k in g and g & state.keys() for g in tied)]
    if missing or unexpected:
        raise ValueError(
            f"checkpoint {path}: weights do not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}"
        )


def check_same_critic(path: Path, state: dict[str, Any], algorithm: str, value_model: str) -> None:
    """Raise unless the checkpoint's critic (none, a shared head or a separate value model; its
    weights and optimizer state) is the one ``learner.algorithm`` and ``learner.value_model`` build."""
    critic = ALGORITHMS.get(algorithm).critic
    if (state["value_head"] is None) != (not critic):
        raise ValueError(
            f"checkpoint {path} was written with learner.algorithm = {state['algorithm']!r}; "
            f"it cannot resume learner.algorithm = {algorithm!r} "
            f"(the value head and optimizer state differ)"
        )
    # Checkpoints from before learner.value_model existed hold a shared head.
    kind = state.get("value_model") or "shared"
    if critic and kind != value_model:
        raise ValueError(
            f"checkpoint {path} was written with learner.value_model = {kind!r}; it cannot "
            f"resume learner.value_model = {value_model!r} (the critics differ)"
        )


def _load_model_weights(path: Path, model: torch.nn.Module) -> None:
    state = read_model_weights(path)
    missing, unexpected = model.load_state_dict(state, strict=False)
    check_loaded(path, state, list(missing), list(unexpected), tied_groups(model))


def load_checkpoint_files(path: Path, model: torch.nn.Module | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Load ``path``'s weights into ``model`` (None: leave them to the caller, see
    :func:`read_model_weights`); return (trainer state, extra state)."""
    path = Path(path)
    if not (path / STATE_FILE).exists():
        raise FileNotFoundError(
            f"{path} is not a learner checkpoint (no {STATE_FILE}); "
            f"pass a checkpoints/step_NNNNNN directory written by the learner"
        )
    if model is not None:
        _load_model_weights(path, model)
    state = torch.load(path / STATE_FILE, map_location="cpu", weights_only=True)
    extra = json.loads((path / EXTRA_FILE).read_text()) if (path / EXTRA_FILE).exists() else {}
    return state, extra


def _checkpoints(ckpt_dir: Path) -> list[Path]:
    if not Path(ckpt_dir).is_dir():
        return []
    done = [
        p for p in Path(ckpt_dir).iterdir() if p.is_dir() and not p.name.endswith(".tmp") and (p / STATE_FILE).exists()
    ]
    return sorted(done, key=lambda p: p.name)


def latest_checkpoint(ckpt_dir: Path) -> Path | None:
    """The newest complete checkpoint under ``ckpt_dir`` (names sort by step), or None."""
    found = _checkpoints(ckpt_dir)
    return found[-1] if found else None


def prune_checkpoints(ckpt_dir: Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` complete checkpoints; returns what was deleted."""
    found = _checkpoints(ckpt_dir)
    gone = found[: max(0, len(found) - keep)]
    for p in gone:
        shutil.rmtree(p)
    return gone
