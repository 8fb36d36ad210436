"""Writing weight tensors to the files an engine loads: shared by the vLLM, remote and LoRA engines.

    path = Path(tempfile.mkdtemp(prefix="agentgym-weights-", dir=shm_dir()))
    save_safetensors(tensors, path / "model.safetensors")

``shm_dir`` is /dev/shm where it is writable (the file never touches a disk), else None (the
system's temporary directory). torch and safetensors are imported only when a file is written.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def shm_dir() -> str | None:
    """/dev/shm when it exists and is writable, else None (tempfile's default directory)."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


def save_safetensors(tensors: Mapping[str, torch.Tensor], path: Path) -> None:
    """``tensors`` as one safetensors file at ``path``, on the CPU; tied weights (one storage
    under two names, which safetensors refuses) are written as copies."""
    from safetensors.torch import save_file

    seen: set[int] = set()
    out = {}
    for name, t in tensors.items():
        t = t.detach().to("cpu").contiguous()
        ptr = t.untyped_storage().data_ptr()
        if ptr in seen and t.numel():  # tied weights share storage; safetensors refuses that
            t = t.clone()
        seen.add(t.untyped_storage().data_ptr())
        out[name] = t
    if not out:
        raise ValueError("VllmEngine.update_weights: no tensors given")
    save_file(out, str(path))
