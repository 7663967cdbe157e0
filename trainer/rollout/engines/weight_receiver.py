"""`WeightReceiver`: the engine side of SGLang's NCCL weight update, for `vistarl engine serve`.

The trainer's `DistributedSync` drives it exactly as it drives SGLang: `/init_weights_update_group`
joins the trainer's process group as rank `rank_offset` (one engine rank here), then each
`/update_weights_from_distributed` call announces a bucket's names, dtypes and shapes while trainer
rank 0 broadcasts the tensors in that order. Names arrive as checkpoint names and are mapped to the
model's live names; on CPU the same path runs over gloo.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

from trainer.learner.weight_sync import init_weight_update_group, live_name
from trainer.rollout.engines.base import EngineRequestError
from trainer.rollout.engines.sglang_api import InitWeightsUpdateGroupBody, UpdateWeightsFromDistributedBody

DEFAULT_TIMEOUT = timedelta(minutes=10)


class WeightReceiver:
    """Joins weight-update groups and receives buckets onto `device`; every wait is bounded by `timeout`."""

    def __init__(self, device: torch.device, model_type: str, timeout: timedelta = DEFAULT_TIMEOUT) -> None:
        self.device = device
        self.model_type = model_type
        self.timeout = timeout
        self.groups: dict[str, dist.ProcessGroup] = {}

    def join(self, body: InitWeightsUpdateGroupBody) -> None:
        """Join the group as rank `rank_offset` of `world_size`; blocks until the trainer joins too.

        A group of the same name is left first: a restarted trainer forms its group afresh."""
        previous = self.groups.pop(body.group_name, None)
        if previous is not None:
            dist.destroy_process_group(previous)
        self.groups[body.group_name] = init_weight_update_group(
            body.master_address,
            body.master_port,
            body.rank_offset,
            body.world_size,
            body.group_name,
            body.backend,
            self.timeout,
        )

    def receive(self, body: UpdateWeightsFromDistributedBody) -> dict[str, torch.Tensor]:
        """One bucket, broadcast from rank 0 in the announced order, under the model's live names."""
        group = self.groups.get(body.group_name)
        if group is None:
            raise EngineRequestError(
                f"not in weight-update group {body.group_name!r}: call /init_weights_update_group"
            )
        tensors = {
            live_name(name, self.model_type): torch.empty(shape, dtype=_dtype(dtype), device=self.device)
            for name, dtype, shape in zip(body.names, body.dtypes, body.shapes, strict=True)
        }
        works = [dist.broadcast(tensor, src=0, group=group, async_op=True) for tensor in tensors.values()]
        for work in works:
            assert work is not None
            work.wait(self.timeout)
        return tensors

    def close(self) -> None:
        """Leave every group."""
        for group in self.groups.values():
            dist.destroy_process_group(group)
        self.groups.clear()


def _dtype(name: str) -> torch.dtype:
    """The torch dtype SGLang's body names (`bfloat16`, `float32`, ...)."""
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise EngineRequestError(f"unknown dtype {name!r}")
    return dtype
