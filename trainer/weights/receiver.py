"""`WeightReceiver`: the NCCL transport's engine side, for `vistarl engine serve`.

The trainer's `DistributedSync` drives it exactly as it drives SGLang: `/init_weights_update_group`
joins the trainer's process group as rank `rank_offset` (one engine rank here), then each
`/update_weights_from_distributed` call announces a bucket's checkpoint names, dtypes and shapes while
trainer rank 0 broadcasts the tensors in that order. Each tensor is received straight into the engine's
parameter of that (live) name when dtype and layout allow, else into a buffer on the parameter's device
that is then copied in; names and shapes are all checked first. The last bucket is answered once its
tensors have arrived on the device. On CPU the same path runs over gloo.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta

import torch
import torch.distributed as dist

from vistarl.trainer.rollout.engines.sglang_api import (
    InitWeightsUpdateGroupBody,
    UpdateWeightsFromDistributedBody,
)
from vistarl.trainer.weights.group import init_weight_update_group
from vistarl.trainer.weights.names import live_name
from vistarl.trainer.weights.targets import WeightLoadError, load_targets

__all__ = ["WeightReceiver"]

DEFAULT_TIMEOUT = timedelta(minutes=10)


class WeightReceiver:
    """Joins weight-update groups and receives buckets into parameters; every wait bounded by `timeout`."""

    def __init__(self, model_type: str, timeout: timedelta = DEFAULT_TIMEOUT) -> None:
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

    def receive_into(self, body: UpdateWeightsFromDistributedBody, live: Mapping[str, torch.Tensor]) -> None:
        """One bucket, broadcast from rank 0 in the announced order, into `live` (tensors by live name)."""
        group = self.groups.get(body.group_name)
        if group is None:
            raise WeightLoadError(
                f"not in weight-update group {body.group_name!r}: call /init_weights_update_group"
            )
        names = [live_name(name, self.model_type) for name in body.names]
        targets = load_targets(live, names, body.shapes)
        dtypes = [_dtype(name) for name in body.dtypes]
        buffers = [
            target
            if target.dtype == dtype and target.is_contiguous()
            else torch.empty(target.shape, dtype=dtype, device=target.device)
            for target, dtype in zip(targets, dtypes, strict=True)
        ]
        with torch.no_grad():
            works = [dist.broadcast(buffer, src=0, group=group, async_op=True) for buffer in buffers]
            for work in works:
                assert work is not None
                work.wait(self.timeout)
            for target, buffer in zip(targets, buffers, strict=True):
                if buffer is not target:
                    target.copy_(buffer)
        if body.flush_cache and targets and targets[0].is_cuda:
            torch.cuda.synchronize(targets[0].device)  # the version is reported once the weights are in place

    def close(self) -> None:
        """Leave every group."""
        for group in self.groups.values():
            dist.destroy_process_group(group)
        self.groups.clear()


def _dtype(name: str) -> torch.dtype:
    """The torch dtype SGLang's body names (`bfloat16`, `float32`, ...)."""
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise WeightLoadError(f"unknown dtype {name!r}")
    return dtype
