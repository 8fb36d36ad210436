"""A weight version as chunks, with what changed since earlier versions: the learner's half of
the weight transfer (docs/adr/0011-weight-transfer.md).

    exporter = WeightExporter(chunk_bytes=64 << 20)
    tensors = trainer.export_weights("bfloat16", sources=True)   # each writes itself into its chunk
    chunks, chunk_versions = exporter.build(version, tensors, trainer.trained_names())

Each tensor's crc32 is compared with its previous export; a tensor keeps the version it last
changed in. Tensors are laid out oldest-change first, so tensors that do not change (frozen
ones: embeddings kept fixed, a LoRA run's base model) fill chunks of their own, and
``chunk_versions[i]`` (the newest change among chunk i's tensors) lets an actor that already
holds a version skip every chunk unchanged since. With full fine-tuning every tensor changes
every step and every chunk travels: tensors the trainer trains are not hashed (``trained``).
Chunks are written into buffers kept from earlier exports (``protocol.weights.ChunkBuffers``):
about one export's worth waits between versions, so an export does not fault in fresh memory.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from agentgym.protocol.messages import WeightChunk
from agentgym.protocol.weights import ChunkBuffers, RawTensor, TensorSource, crc32, make_chunks, tensor_nbytes


class WeightExporter:
    def __init__(self, chunk_bytes: int) -> None:
        self.chunk_bytes = chunk_bytes
        self._digest: dict[str, tuple[str, int]] = {}
        self._changed_at: dict[str, int] = {}
        self.buffers = ChunkBuffers(keep_bytes=0)  # grown to the size of an export by build()

    def build(
        self, version: int, tensors: Sequence[RawTensor], trained: Collection[str] = ()
    ) -> tuple[list[tuple[WeightChunk, memoryview]], list[int]]:
        """Chunks of ``version`` (every tensor, whole) and each chunk's newest change version.

        ``trained``: names of tensors the optimizer updates (``Trainer.trained_names``), taken
        as changed without a digest: with full fine-tuning that is every tensor, and hashing them
        was one of the export's four passes over the weights. Only the others (frozen tensors,
        buffers) are compared with their previous export."""
        for t in tensors:
            if t.name in trained:
                self._digest.pop(t.name, None)
                self._changed_at[t.name] = version
                continue
            d = (t.dtype, crc32(t.data.host_bytes() if isinstance(t.data, TensorSource) else t.data))
            if self._digest.get(t.name) != d:
                self._digest[t.name], self._changed_at[t.name] = d, version
        # Oldest change first; ties keep the model's order (sorted is stable).
        ordered = sorted(tensors, key=lambda t: self._changed_at[t.name])
        # Keep as many bytes as one export: with the snapshot being served, the two a swap holds.
        self.buffers.keep_bytes = max(self.buffers.keep_bytes, sum(tensor_nbytes(t.dtype, t.shape) for t in ordered))
        chunks = make_chunks(version, ordered, self.chunk_bytes, alloc=self.buffers.take)
        return chunks, [max(self._changed_at[m.name] for m in msg.tensors) for msg, _ in chunks]
