"""Methods added to every vLLM worker (``worker_extension_cls``): in-place weight loads from files.

    AsyncEngineArgs(..., worker_extension_cls="agentgym.actors.engines.vllm_worker_ext.WeightLoader")
    await llm.collective_rpc("agentgym_load_safetensors", kwargs={"paths": ["/dev/shm/.../w.safetensors"]})

vLLM's engine core runs in another process; tensors passed through ``collective_rpc`` arrive
there as lists, and sending a function needs ``VLLM_ALLOW_INSECURE_SERIALIZATION``. A named
method on the worker needs neither: the actor writes the weights to a safetensors file (on
``/dev/shm`` where there is one) and sends only its path. The worker streams the tensors into
its own ``reload_weights``, which runs the model's checkpoint loader and re-applies the
backend's weight processing (the CPU backend repacks linear layers, which is why calling the
model's ``load_weights`` directly does not work there).

This module is imported inside the engine core process: keep it free of agentgym imports.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path


class WeightLoader:
    """Mixed into vLLM's worker class; ``self`` is the worker (``self.reload_weights`` is its)."""

    def agentgym_load_safetensors(self, paths: list[str]) -> int:
        """Load every tensor of the given safetensors files in place; returns how many."""
        from safetensors import safe_open

        for p in paths:
            if not Path(p).is_file():
                raise FileNotFoundError(f"agentgym_load_safetensors: no weights file at {p}")
        count = 0

        def tensors() -> Iterator[tuple[str, object]]:
            nonlocal count
            for p in paths:
                with safe_open(p, framework="pt", device="cpu") as f:
                    for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                        count += 1
                        yield name, f.get_tensor(name)

        self.reload_weights(weights_iterator=tensors(), is_checkpoint_format=True)  # type: ignore[attr-defined]  # the vLLM worker's, which this extension is mixed into
        return count
