"""The trainer's weights leaving it: exported for the actors, saved to and restored from checkpoints.

    class Trainer(TrainerState): ...      # learner/training/trainer.py holds the model, optimizer, dp, cfg

With fsdp every method here is a collective: rank 0 sends the command (``export``, ``save``,
``load``) that ranks 1.. answer from their command loop (learner/training/distributed.py), and the full
weights are gathered to rank 0 on the CPU.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import structlog
import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from agentgym.learner.model.lora import export_adapter, load_adapter
from agentgym.learner.training.checkpoint import (
    check_loaded,
    check_same_critic,
    load_checkpoint_files,
    prune_checkpoints,
    read_model_weights,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from agentgym.protocol.weights import RawTensor

if TYPE_CHECKING:
    from agentgym.config import Config
    from agentgym.learner.model.value_model import SeparateValueModel, ValueHead
    from agentgym.learner.training.distributed import DataParallel

log = structlog.get_logger(__name__)


class TrainerState:
    """Methods of ``Trainer`` (learner/training/trainer.py) that export, save and load its weights."""

    # The trainer's state these methods read, set by ``Trainer.__init__``.
    cfg: Config
    dp: DataParallel
    fsdp: bool
    lora: bool
    model: torch.nn.Module
    value_head: ValueHead | SeparateValueModel | None
    trained_modules: torch.nn.ModuleDict
    optimizer: torch.optim.Optimizer
    tokenizer_dir: Path
    tied: list[set[str]]
    step: int
    _collective: threading.Lock

    if TYPE_CHECKING:

        @property
        def version(self) -> int: ...  # Trainer.version

    def _full(self, module: torch.nn.Module) -> dict[str, torch.Tensor]:
        """``module``'s whole weights: its own state dict, or with fsdp gathered to rank 0 on the
        CPU (a collective: every rank calls it; ranks 1.. get an empty dict)."""
        if not self.fsdp:
            return module.state_dict()
        state = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return cast("dict[str, torch.Tensor]", state)  # a model's full state: tensors by name

    def trained_names(self) -> frozenset[str]:
        """Names (as ``export_weights`` gives them) of the tensors the optimizer updates: each
        export may take them as changed without comparing (learner/training/weight_export.py). Empty with
        LoRA, whose export is the adapter alone, hashed as it is small."""
        if self.lora:
            return frozenset()
        return frozenset(n for n, p in self.model.named_parameters(remove_duplicate=False) if p.requires_grad)

    def export_weights(self, dtype: str = "float32", *, sources: bool = False) -> list[RawTensor]:
        """The current weights as raw named tensors (HF names, as vLLM's loaders expect); with
        fsdp, ranks 1.. take part in the gather (the ``export`` command) and return [].
        With LoRA: the adapter's tensors only (peft names), in the engine's dtype (model.dtype),
        which is what the engine computes the adapter in (learner/model/lora.py).

        ``sources``: each tensor's data is a ``TorchSource`` (protocol/weights.py) that
        ``make_chunks`` has write straight into its chunk, from the GPU where it lives, instead of
        host bytes copied again into the chunk (one pass over the weights fewer on a GPU)."""
        if self.lora:
            with self._collective:
                return export_adapter(self.model, self.cfg.model.dtype)
        with self._collective:
            if self.fsdp and self.dp.rank == 0:
                self.dp.send_command("export")
            state = self._full(self.model)
        out = []
        tdtype = getattr(torch, dtype)
        seen: set[int] = set()
        for name, t in state.items():
            # Tied embeddings appear twice in a state dict (embed_tokens and lm_head): send the
            # storage once; vLLM's and transformers' loaders tie lm_head to it themselves.
            if t.numel() and t.data_ptr() in seen:
                continue
            seen.add(t.data_ptr())
            if sources:  # converted and copied slice by slice, by make_chunks
                out.append(RawTensor(name, dtype, tuple(t.shape), TorchSource(t, tdtype)))
                continue
            t = t.detach().to(tdtype).contiguous().cpu()
            raw = (
                t.view(torch.uint8)
                if t.element_size() == 1
                else t.view(torch.int16 if t.element_size() == 2 else torch.int32)
            )
            # A view, no copy: it may alias a live parameter, so the caller copies (make_chunks
            # does) before the next optimizer step.
            out.append(RawTensor(name, dtype, tuple(t.shape), memoryview(raw.numpy()).cast("B")))  # type: ignore[arg-type]  # numpy's stubs give ndarray __buffer__ only from Python 3.12
        return out

    def save(self, path: Path | None, extra_state: dict[str, Any] | None = None) -> None:
        """A checkpoint directory (learner/training/checkpoint.py): an HF model vLLM and transformers load,
        plus optimizer, value head, step, version, RNG states and ``extra_state`` (JSON-able, the
        service's own state). Keeps the newest ``learner.keep_checkpoints`` next to it. Rank 0
        writes; with replicate every rank holds the same state, with fsdp ranks 1.. take part in
        gathering it (the ``save`` command, ``path`` None there).

        The optimizer state is keyed by parameter name (``policy.<HF name>``, ``value_head.*``),
        whole (not sharded), so a checkpoint resumes under either dp_mode and any dp_size."""
        with self._collective:
            if self.dp.rank != 0 and not self.fsdp:
                return
            if self.fsdp and self.dp.rank == 0:
                self.dp.send_command("save")
            opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
            model_state = self._full(self.model) if self.fsdp else None
            value_state = self._full(self.value_head) if self.value_head is not None else None
            optim_state = get_optimizer_state_dict(self.trained_modules, self.optimizer, options=opts)
        if self.dp.rank != 0:
            return
        assert path is not None, "rank 0 saves to a path"
        state = {
            "step": self.step,
            "version": self.version,
            "algorithm": self.cfg.learner.algorithm,
            "optimizer": optim_state,
            "value_head": value_state,
            "rng": rng_state(),
            "value_model": self.cfg.learner.value_model if self.value_head is not None else None,
        }
        path = Path(path)
        save_checkpoint(path, self.model, self.tokenizer_dir, state, extra_state or {}, model_state)
        gone = prune_checkpoints(path.parent, self.cfg.learner.keep_checkpoints)
        log.info("checkpoint_written", path=str(path), step=self.step, pruned=[p.name for p in gone])

    def load_checkpoint(self, path: Path) -> dict[str, Any]:
        """Restore a checkpoint written by :meth:`save` (on every rank); returns its extra state."""
        path = Path(path)
        with self._collective:
            if self.dp.rank == 0:
                self.dp.send_command("load", str(path))
            state, extra = load_checkpoint_files(path, None if self.fsdp or self.lora else self.model)
            if self.lora:
                load_adapter(self.model, path)
            check_same_critic(path, state, self.cfg.learner.algorithm, self.cfg.learner.value_model)
            full = StateDictOptions(full_state_dict=True, strict=False)
            if self.fsdp:  # every rank reads the whole weights and keeps its shard
                weights: dict[str, Any] = read_model_weights(path)  # torch's dict of state values
                missing, unexpected = set_model_state_dict(self.model, weights, options=full)
                check_loaded(path, weights, list(missing), list(unexpected), self.tied)
            if self.value_head is not None:
                set_model_state_dict(
                    self.value_head, state["value_head"], options=StateDictOptions(full_state_dict=True)
                )
            set_optimizer_state_dict(
                self.trained_modules, self.optimizer, state["optimizer"], options=StateDictOptions(full_state_dict=True)
            )
        self.step = int(state["step"])
        if self.dp.rank == 0:
            set_rng_state(state["rng"])
        else:
            torch.manual_seed(self.cfg.run.seed + self.dp.rank + 1_000_003 * self.step)
        return extra


class TorchSource:
    """A tensor, wherever it lives, as a ``protocol.weights.TensorSource``: ``write`` converts the
    elements a byte range covers to the wire dtype where they live and copies them into host
    memory (from a GPU: one device-to-host copy into the chunk). Converted a slice at a time, so
    a float32 model exported in bfloat16 never holds a converted copy of all its weights. Like
    the host views of ``export_weights``, it may alias a live parameter: chunks are made from it
    before the next optimizer step (learner/service.py exports and chunks in one thread call)."""

    def __init__(self, t: torch.Tensor, dtype: torch.dtype) -> None:
        self._flat = t.detach().reshape(-1)
        self._dtype = dtype
        self._isz = torch.empty((), dtype=dtype).element_size()
        self.nbytes = self._flat.numel() * self._isz

    def _bytes(self, start: int, stop: int) -> torch.Tensor:
        """Bytes ``[start, stop)`` in the wire dtype, on the tensor's device."""
        e0, e1 = start // self._isz, -(-stop // self._isz)
        part = self._flat[e0:e1].to(self._dtype).contiguous().view(torch.uint8)
        return part[start - e0 * self._isz : stop - e0 * self._isz]

    def write(self, offset: int, dest: memoryview) -> None:
        if len(dest):
            torch.frombuffer(dest, dtype=torch.uint8).copy_(self._bytes(offset, offset + len(dest)))

    def host_bytes(self) -> bytes:
        return self._bytes(0, self.nbytes).cpu().numpy().tobytes()
