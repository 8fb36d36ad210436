"""Read an offline W&B run back: the history rows, metric definitions and config of a
``run-*.wandb`` file, for tests of agentgym/observe/sinks.py.

    rows, metrics, config = read_wandb_run(next(run_dir.glob("wandb/offline-run-*/run-*.wandb")))

The file is W&B's transaction log: a 7-byte header (``:W&B``, a 2-byte magic, a version byte)
followed by LevelDB log records (32 KiB blocks; each record a 4-byte CRC, a 2-byte length and a
type: full, first, middle, last), each holding one ``wandb.proto.wandb_internal_pb2.Record``.
wandb (0.2x on) writes it from its Go core and ships no Python reader; the protobuf it ships
decodes the records.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BLOCK = 32 * 1024
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def _payloads(data: bytes) -> Iterator[bytes]:
    if data[:4] != b":W&B":
        raise ValueError(f"not a W&B transaction log (header {data[:7]!r})")
    pos, parts = 7, b""
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:  # a block's tail too short for a record header is padding
            pos += left
            continue
        _crc, n, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:  # zero padding to the end of the block
            pos += left
            continue
        chunk = data[pos + 7 : pos + 7 + n]
        pos += 7 + n
        if kind == FULL:
            yield chunk
        elif kind == FIRST:
            parts = chunk
        elif kind == MIDDLE:
            parts += chunk
        elif kind == LAST:
            yield parts + chunk


def read_wandb_run(path: Path) -> tuple[list[dict[str, Any]], list[Any], dict[str, Any]]:
    """(history rows as dicts, metric definitions, config) of one offline run file."""
    from wandb.proto import wandb_internal_pb2 as pb

    rows: list[dict[str, Any]] = []
    metrics: list[Any] = []
    config: dict[str, Any] = {}
    for payload in _payloads(Path(path).read_bytes()):
        rec = pb.Record()
        rec.ParseFromString(payload)
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item})
        elif kind == "metric":
            metrics.append(rec.metric)
        elif kind in ("run", "config"):
            updates = rec.run.config.update if kind == "run" else rec.config.update
            config.update({u.key or "/".join(u.nested_key): json.loads(u.value_json) for u in updates})
    return rows, metrics, config
