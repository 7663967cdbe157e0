"""`WeightSync`: what every trainer rank holds to push its weights, and `weight_sync`, which builds it.

`WeightSync.push(model, version)` runs on every rank, on the thread that runs the trainer's
collectives: each rank walks the model's buckets (`buckets.gathered_buckets`, a collective), and rank
0's transport sends them to the engine. The transport is the one the engine names
(`weight_transports`): `in_process` for an engine in this process, else `sync.mode` (`disk` or
`nccl`) among those the engine takes; for an engine pool it reaches every server the pool names
(`transport.push_targets`).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
from torch import nn
from transformers import PretrainedConfig

from vistarl.trainer.config import SyncConfig
from vistarl.trainer.weights.buckets import gathered_buckets
from vistarl.trainer.weights.disk import DiskEngine, DiskSync
from vistarl.trainer.weights.in_process import InProcessSync, LocalEngine
from vistarl.trainer.weights.nccl import BroadcastEngine, DistributedSync, DistributedTarget
from vistarl.trainer.weights.transport import EngineCalls, Transport, TransportKind, push_targets

__all__ = ["ENGINE_CALL_TIMEOUT_S", "WeightSync", "WeightTarget", "transport_kind", "weight_sync"]

ENGINE_CALL_TIMEOUT_S = 600.0


class WeightTarget(Protocol):
    """An engine, as far as picking its transport goes."""

    @property
    def weight_transports(self) -> tuple[TransportKind, ...]:
        """The transports the engine takes, `in_process` first where it is one."""
        ...


@dataclass
class WeightSync:
    """Every rank's side of a push (see the module docstring); only rank 0's has a `transport`."""

    config: PretrainedConfig
    dtype: torch.dtype | None
    bucket_bytes: int
    transport: Transport | None = None

    def push(
        self,
        model: nn.Module,
        version: int,
        *,
        reconnect: bool = False,
        engines: Sequence[int] | None = None,
    ) -> None:
        """Every rank: gather `model`'s buckets; rank 0 makes the engine serve them as `str(version)`, with
        `reconnect` over a connection formed afresh (a restarted engine never joined the old one), to
        `engines` of a pool's servers (None: all)."""
        buckets = gathered_buckets(model, self.config, self.dtype, self.bucket_bytes)
        try:
            if self.transport is not None:
                if reconnect:
                    self.transport.reconnect(engines)
                self.transport.push(buckets, version)
        finally:
            # This rank's part of every gather: the other ranks walk every bucket, even when the
            # transport fails midway, so they are not left waiting in a collective.
            collections.deque(buckets, maxlen=0)

    def close(self) -> None:
        """Release the transport's process group, if any."""
        if self.transport is not None:
            self.transport.close()


def transport_kind(engine: WeightTarget, mode: TransportKind) -> TransportKind:
    """`in_process` when the engine takes it, else `mode` if the engine takes that; else a `ValueError`."""
    kinds = engine.weight_transports
    if "in_process" in kinds:
        return "in_process"
    if mode not in kinds:
        raise ValueError(
            f"sync.mode={mode} is not a transport {type(engine).__name__} takes ({', '.join(kinds)})"
        )
    return mode


def weight_sync(
    engine: WeightTarget,
    sync: SyncConfig,
    *,
    config: PretrainedConfig,
    dtype: torch.dtype | None,
    weights_dir: Path,
    source_dir: Path,
    pause: bool,
    loop: asyncio.AbstractEventLoop,
    backend: str = "nccl",
) -> WeightSync:
    """Rank 0's `WeightSync` to `engine`, whose calls run on `loop`: the transport the engine names.

    `weights_dir` and `source_dir` are the disk transport's (where versions go, where the tokenizer
    files come from); `pause` holds a server's generation around a disk load; `backend` is the NCCL
    transport's process-group backend (gloo for weights on the CPU)."""
    calls = EngineCalls(loop, ENGINE_CALL_TIMEOUT_S)
    kind = transport_kind(engine, sync.mode)
    targets = push_targets(engine)
    broadcast = [target for target in targets if isinstance(target, BroadcastEngine)]
    disk = [target for target in targets if isinstance(target, DiskEngine)]
    transport: Transport
    if kind == "in_process" and isinstance(engine, LocalEngine):
        transport = InProcessSync(engine, calls)
    elif kind == "nccl" and len(broadcast) == len(targets):
        meet = DistributedTarget(
            sync.master_address, sync.master_port, sync.engine_world_size, backend=backend
        )
        transport = DistributedSync(broadcast, calls, meet, config.model_type)
    elif kind == "disk" and len(disk) == len(targets):
        transport = DiskSync(disk, calls, weights_dir, config, source_dir, dtype=dtype, pause=pause)
    else:
        raise TypeError(f"{type(engine).__name__} names transport {kind!r} but lacks its calls")
    return WeightSync(config, dtype, sync.bucket_mb * 1024 * 1024, transport)
