"""Read back what an offline Weights & Biases run wrote: the records of its `run-<id>.wandb` file.

The file is a LevelDB-style log (wandb's header, then 32 KiB blocks of chunks, each with a 7-byte header:
checksum, length, kind) of wandb's protobuf `Record`s; the wandb package itself has no reader of it.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from wandb.proto import wandb_internal_pb2

HEADER = 7  # b":W&B", a 2-byte magic, a 1-byte version
BLOCK = 32 * 1024
FULL, LAST = 1, 4  # a record whole, or its last chunk (FIRST = 2 and MIDDLE = 3 begin and go on)


def records(path: Path) -> list[Any]:
    """Every `Record` of a `.wandb` file, in order."""
    data = path.read_bytes()
    assert data.startswith(b":W&B"), f"{path} is not a W&B run file"
    found, pending, at = [], b"", HEADER
    while at + 7 <= len(data):
        room = BLOCK - at % BLOCK
        _, length, kind = struct.unpack("<IHB", data[at : at + 7]) if room >= 7 else (0, 0, 0)
        if kind == 0:  # zeros: the rest of the block is padding
            at += room
            continue
        chunk, at = data[at + 7 : at + 7 + length], at + 7 + length
        pending += chunk
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            found.append(record)
            pending = b""
    return found


def history(path: Path) -> dict[int, dict[str, Any]]:
    """The logged rows by step: each key (a nested one joined by "/") with its value."""
    rows: dict[int, dict[str, Any]] = {}
    for record in records(path):
        if record.WhichOneof("record_type") == "history":
            row = {
                item.key or "/".join(item.nested_key): json.loads(item.value_json)
                for item in record.history.item
            }
            rows.setdefault(int(row["_step"]), {}).update(row)
    return rows


def config(path: Path) -> dict[str, Any]:
    """The run's config, as the run record carries it (W&B wraps each value as {"value": ...})."""
    for record in records(path):
        if record.WhichOneof("record_type") == "run":
            items = record.run.config.update
            return {item.key: json.loads(item.value_json) for item in items}
    raise AssertionError(f"{path} has no run record")
