"""The NCCL transport, trainer side: SGLang's `/update_weights_from_distributed` protocol, GPU to GPU.

Trainer rank 0 and the engine's ranks form a process group (`/init_weights_update_group`, then
`group.init_weight_update_group` on both sides). Then, bucket by bucket, one
`/update_weights_from_distributed` call announces checkpoint names, dtypes and shapes while rank 0
broadcasts the tensors in that order, straight from its device; the HTTP call and the broadcast block
on each other, so the call runs on the engine's loop while the broadcast is posted here. The next
bucket is gathered while one travels (`transport.pipelined`); the last bucket flushes the cache and
sets the version. SGLang and `vistarl engine serve` (`receiver`) take it alike; on CPU it runs over gloo.
`close` leaves the group, and the next push forms a new one under a fresh name (`group.fresh_group_name`):
that is how a restarted engine joins again.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol, runtime_checkable

import torch.distributed as dist

from vistarl.trainer.rollout.engines.sglang_api import (
    InitWeightsUpdateGroupBody,
    UpdateWeightsFromDistributedBody,
    UpdateWeightsResponse,
)
from vistarl.trainer.weights.buckets import Bucket
from vistarl.trainer.weights.group import (
    DEFAULT_GROUP_NAME,
    fresh_group_name,
    init_weight_update_group,
    leave_group,
)
from vistarl.trainer.weights.names import checkpoint_name
from vistarl.trainer.weights.transport import EngineCalls, PausableEngine, Waiter, paused, pipelined

__all__ = ["BroadcastEngine", "DistributedSync", "DistributedTarget", "distributed_body"]


@runtime_checkable
class BroadcastEngine(PausableEngine, Protocol):
    """An engine that takes SGLang's NCCL weight update."""

    async def init_weights_update_group(self, body: InitWeightsUpdateGroupBody) -> UpdateWeightsResponse:
        """Join the trainer's group; answers once every rank has joined."""
        ...

    async def update_weights_from_distributed(
        self, body: UpdateWeightsFromDistributedBody
    ) -> UpdateWeightsResponse:
        """Receive one announced bucket from trainer rank 0."""
        ...


@dataclass(frozen=True)
class DistributedTarget:
    """Where trainer rank 0 meets an engine's ranks for weight broadcasts."""

    master_address: str
    master_port: int
    engine_world_size: int = 1
    group_name: str = DEFAULT_GROUP_NAME
    backend: str = "nccl"
    timeout: timedelta = timedelta(minutes=10)


def distributed_body(
    bucket: Bucket, model_type: str, group_name: str, version: int
) -> UpdateWeightsFromDistributedBody:
    """The `/update_weights_from_distributed` body of one bucket; the last flushes and sets the version."""
    return UpdateWeightsFromDistributedBody(
        names=[checkpoint_name(name, model_type) for name, _ in bucket.tensors],
        dtypes=[str(tensor.dtype).removeprefix("torch.") for _, tensor in bucket.tensors],
        shapes=[list(tensor.shape) for _, tensor in bucket.tensors],
        group_name=group_name,
        flush_cache=bucket.last,
        weight_version=str(version) if bucket.last else None,
    )


class DistributedSync:
    """SGLang's NCCL weight update, driven from trainer rank 0 (see the module docstring)."""

    def __init__(
        self,
        engine: BroadcastEngine,
        calls: EngineCalls,
        target: DistributedTarget,
        model_type: str,
        *,
        pause: bool = True,
    ) -> None:
        self.engine = engine
        self.calls = calls
        self.target = target
        self.model_type = model_type
        self.pause = pause
        self._group: dist.ProcessGroup | None = None
        self._group_name = target.group_name

    def connect(self) -> dist.ProcessGroup:
        """Form the group: the engine's `/init_weights_update_group` and rank 0's join, concurrently."""
        t = self.target
        self._group_name = fresh_group_name(t.master_address, t.master_port, t.group_name)
        body = InitWeightsUpdateGroupBody(
            master_address=t.master_address,
            master_port=t.master_port,
            rank_offset=1,
            world_size=1 + t.engine_world_size,
            group_name=self._group_name,
            backend=t.backend,
        )
        answer = self.calls.start(self.engine.init_weights_update_group(body))
        world = 1 + t.engine_world_size
        group = init_weight_update_group(
            t.master_address, t.master_port, 0, world, self._group_name, t.backend, t.timeout
        )
        self.calls.wait(answer)
        self._group = group
        return group

    def push(self, buckets: Iterable[Bucket], version: int) -> None:
        """Broadcast bucket by bucket, generation paused around them (the first push forms the group)."""
        group = self._group or self.connect()
        with paused(self.calls, self.engine, self.pause):
            pipelined(buckets, functools.partial(self._send, group=group, version=version))

    def _send(self, bucket: Bucket, group: dist.ProcessGroup, version: int) -> Waiter:
        """Announce one bucket and post its broadcasts; the waiter waits for both, each wait bounded."""
        body = distributed_body(bucket, self.model_type, self._group_name, version)
        answer = self.calls.start(self.engine.update_weights_from_distributed(body))
        works = [dist.broadcast(tensor, src=0, group=group, async_op=True) for _, tensor in bucket.tensors]

        def sent() -> None:
            for work in works:
                assert work is not None
                work.wait(self.target.timeout)
            self.calls.wait(answer)

        return sent

    def close(self) -> None:
        """Leave the weight-update group (bounded: see `group.leave_group`)."""
        if self._group is not None:
            group, self._group = self._group, None
            leave_group(group)
