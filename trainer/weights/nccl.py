"""The NCCL transport, trainer side: SGLang's `/update_weights_from_distributed` protocol, GPU to GPU.

Trainer rank 0 and the engines' ranks form one process group (`/init_weights_update_group` on each
engine, then `group.init_weight_update_group` on every side): rank 0, then each engine's
`engine_world_size` ranks in turn. Then, bucket by bucket, one `/update_weights_from_distributed` call to
each engine announces checkpoint names, dtypes and shapes while rank 0 broadcasts the tensors in that
order, once for every engine, straight from its device; the HTTP calls and the broadcast block on each
other, so the calls run on the engines' loop while the broadcast is posted here. The next bucket is
gathered while one travels (`transport.pipelined`); the last bucket flushes the cache and sets the
version. SGLang and `vistarl engine serve` (`receiver`) take it alike; on CPU it runs over gloo.
`close` leaves the group, and the next push forms a new one under a fresh name (`group.fresh_group_name`):
that is how a restarted engine joins again; `reconnect` also says which engines the new group holds (one
that is down would leave the others waiting for it in every broadcast).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
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
    """Where trainer rank 0 meets the engines' ranks for weight broadcasts (`engine_world_size` each)."""

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
    """SGLang's NCCL weight update to one or several engines, driven from trainer rank 0 (see the module
    docstring)."""

    def __init__(
        self,
        engines: Sequence[BroadcastEngine],
        calls: EngineCalls,
        target: DistributedTarget,
        model_type: str,
        *,
        pause: bool = True,
    ) -> None:
        self.engines = list(engines)
        self.calls = calls
        self.target = target
        self.model_type = model_type
        self.pause = pause
        self.reached = list(self.engines)
        self._group: dist.ProcessGroup | None = None
        self._group_name = target.group_name

    def connect(self) -> dist.ProcessGroup:
        """Form the group: every reached engine's `/init_weights_update_group` and rank 0's join, at once."""
        t = self.target
        self._group_name = fresh_group_name(t.master_address, t.master_port, t.group_name)
        world = 1 + len(self.reached) * t.engine_world_size
        answers = [
            self.calls.start(engine.init_weights_update_group(self._join_body(position, world)))
            for position, engine in enumerate(self.reached)
        ]
        group = init_weight_update_group(
            t.master_address, t.master_port, 0, world, self._group_name, t.backend, t.timeout
        )
        for answer in answers:
            self.calls.wait(answer)
        self._group = group
        return group

    def _join_body(self, position: int, world: int) -> InitWeightsUpdateGroupBody:
        """What the reached engine at `position` joins the group as: its first rank, after rank 0 and the
        engines before it."""
        t = self.target
        return InitWeightsUpdateGroupBody(
            master_address=t.master_address,
            master_port=t.master_port,
            rank_offset=1 + position * t.engine_world_size,
            world_size=world,
            group_name=self._group_name,
            backend=t.backend,
        )

    def push(self, buckets: Iterable[Bucket], version: int) -> None:
        """Broadcast bucket by bucket, generation paused around them (the first push forms the group)."""
        group = self._group or self.connect()
        with paused(self.calls, self.reached, self.pause):
            pipelined(buckets, functools.partial(self._send, group=group, version=version))

    def _send(self, bucket: Bucket, group: dist.ProcessGroup, version: int) -> Waiter:
        """Announce one bucket to every engine and post its broadcasts; the waiter waits for all of them,
        each wait bounded."""
        body = distributed_body(bucket, self.model_type, self._group_name, version)
        answers = [self.calls.start(engine.update_weights_from_distributed(body)) for engine in self.reached]
        works = [dist.broadcast(tensor, src=0, group=group, async_op=True) for _, tensor in bucket.tensors]

        def sent() -> None:
            for work in works:
                assert work is not None
                work.wait(self.target.timeout)
            for answer in answers:
                self.calls.wait(answer)

        return sent

    def reconnect(self, engines: Sequence[int] | None) -> None:
        """Leave the group; the next push forms one with these engines (None: all)."""
        self.close()
        self.reached = self.engines if engines is None else [self.engines[i] for i in engines]

    def close(self) -> None:
        """Leave the weight-update group (bounded: see `group.leave_group`)."""
        if self._group is not None:
            group, self._group = self._group, None
            leave_group(group)
