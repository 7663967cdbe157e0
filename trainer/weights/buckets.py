"""The pushed parameters in buckets, each gathered whole on the trainer's device and cast there.

`gathered_buckets` walks a model's state dict (FSDP2-sharded or plain) in buckets of at most
`bucket_bytes` (counted in the pushed dtype). For each bucket every rank casts its shards to the
pushed dtype and all-gathers them (`DTensor.full_tensor()`), so the full tensors appear on each rank's
device and nothing passes through host memory; on a one-rank mesh the local shard is the whole tensor
and is only cast. It is a collective: every rank must walk the buckets to the end. The transports
overlap the gather of the next bucket with the sending of the current one (`transport.pipelined`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed._functional_collectives import AsyncCollectiveTensor
from torch.distributed.tensor import DTensor
from transformers import PretrainedConfig

from trainer.weights.names import is_tied

__all__ = ["DEFAULT_BUCKET_BYTES", "Bucket", "bucket_tensors", "gathered_buckets", "pushed_dtype"]

DEFAULT_BUCKET_BYTES = 512 * 1024 * 1024
Named = list[tuple[str, torch.Tensor]]


@dataclass(frozen=True)
class Bucket:
    """Full tensors under live names, on the trainer's device; `last` marks the push's final bucket."""

    tensors: Named
    last: bool

    @property
    def nbytes(self) -> int:
        """The bucket's size in bytes."""
        return sum(tensor.nbytes for _, tensor in self.tensors)


def pushed_dtype(tensor: torch.Tensor, dtype: torch.dtype | None) -> torch.dtype:
    """The dtype `tensor` is pushed in: `dtype` for floating-point tensors (if given), else its own."""
    return dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype


def bucket_tensors(
    named: Iterable[tuple[str, torch.Tensor]],
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    dtype: torch.dtype | None = None,
) -> list[Named]:
    """Split tensors, in order, into buckets of at most `bucket_bytes` of their full size in the pushed
    dtype (see `pushed_dtype`); a larger tensor gets its own."""
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
    buckets: list[Named] = []
    current: Named = []
    size = 0
    for name, tensor in named:
        nbytes = tensor.numel() * pushed_dtype(tensor, dtype).itemsize
        if current and size + nbytes > bucket_bytes:
            buckets.append(current)
            current, size = [], 0
        current.append((name, tensor))
        size += nbytes
    if current:
        buckets.append(current)
    return buckets


def gathered_buckets(
    model: nn.Module, config: PretrainedConfig, dtype: torch.dtype | None, bucket_bytes: int
) -> Iterator[Bucket]:
    """Every rank: the model's state dict (a tied `lm_head` left out) as full tensors, bucket by bucket
    (see the module docstring); floating-point tensors cast to `dtype` if given."""
    named = [(name, t) for name, t in model.state_dict().items() if not is_tied(name, config)]
    plan = bucket_tensors(named, bucket_bytes, dtype)
    for i, bucket in enumerate(plan):
        with torch.no_grad():
            tensors = [(name, full_tensor(tensor, pushed_dtype(tensor, dtype))) for name, tensor in bucket]
        yield Bucket(tensors, last=i == len(plan) - 1)


def full_tensor(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The whole of `tensor` in `dtype` on its device: a sharded one is cast shard-wise, then all-gathered
    (a collective); a one-rank mesh's shard is the whole tensor."""
    if not isinstance(tensor, DTensor):
        return tensor.detach().to(dtype).contiguous()
    if tensor.device_mesh.size() == 1:
        return tensor.to_local().detach().to(dtype).contiguous()
    shards = tensor.to(dtype)
    assert isinstance(shards, DTensor)
    full = shards.full_tensor()
    if isinstance(full, AsyncCollectiveTensor):
        full = full.wait()
    return full.contiguous()
