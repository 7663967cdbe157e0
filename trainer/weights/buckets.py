"""The pushed parameters in buckets, each gathered whole on the trainer's device and cast there.

`gathered_buckets` walks a model's state dict (FSDP2-sharded or plain) in buckets of at most
`bucket_bytes` (counted in the pushed dtype). For each bucket every rank casts its shards to the
pushed dtype into one flat buffer (each shard padded to the largest rank's rows, as FSDP2 splits dim
0), all-gathers that buffer in one collective, and cuts each parameter's rows out of it, so the full
tensors appear on each rank's device and nothing passes through host memory. On a one-rank mesh the
local shard is the whole tensor and is only cast; a tensor sharded another way is gathered alone
(`DTensor.full_tensor()`). It is a collective: every rank must walk the buckets to the end. The
transports overlap the gather of the next bucket with the sending of the current one
(`transport.pipelined`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._functional_collectives import AsyncCollectiveTensor
from torch.distributed.tensor import DTensor, Shard
from transformers import PretrainedConfig

from vistarl.trainer.weights.names import is_tied

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
            flat = [(name, t) for name, t in bucket if isinstance(t, DTensor) and _row_sharded(t)]
            full = dict(_gather_flat(flat, dtype)) if flat else {}
            tensors = [
                (name, full[name] if name in full else full_tensor(t, pushed_dtype(t, dtype)))
                for name, t in bucket
            ]
        yield Bucket(tensors, last=i == len(plan) - 1)


def _row_sharded(tensor: DTensor) -> bool:
    """Whether `tensor` is split by rows over a 1-D mesh of several ranks, as FSDP2 shards parameters."""
    return (
        tensor.device_mesh.ndim == 1
        and tensor.device_mesh.size() > 1
        and tensor.placements == (Shard(0),)
        and tensor.dim() > 0
        and tensor.numel() > 0
    )


def _gather_flat(named: list[tuple[str, DTensor]], dtype: torch.dtype | None) -> Named:
    """Row-sharded tensors of one mesh, whole: one all-gather of a flat buffer of their padded shards.

    Rank r holds rows [r·c, (r+1)·c) of a tensor of n rows, c = ceil(n / ranks) (fewer, or none, at
    the end); each shard is padded to c rows, so the gathered buffer holds every rank's segment in
    rank order and each tensor's rows are a strided slice of it."""
    first = named[0][1]
    mesh = first.device_mesh
    ranks = mesh.size()
    rows = [math.ceil(t.shape[0] / ranks) * (t.numel() // t.shape[0]) for _, t in named]
    out_dtype = pushed_dtype(first, dtype)
    if any(pushed_dtype(t, dtype) != out_dtype or t.device_mesh != mesh for _, t in named):
        return [(name, full_tensor(t, pushed_dtype(t, dtype))) for name, t in named]
    flat = torch.empty(sum(rows), dtype=out_dtype, device=first.to_local().device)
    offset = 0
    for (_, tensor), size in zip(named, rows, strict=True):
        local = tensor.to_local().reshape(-1)
        flat[offset : offset + local.numel()].copy_(local)
        offset += size
    gathered = torch.empty(ranks * flat.numel(), dtype=out_dtype, device=flat.device)
    dist.all_gather_into_tensor(gathered, flat, group=mesh.get_group())
    segments = gathered.view(ranks, flat.numel())
    full: Named = []
    offset = 0
    for (name, tensor), size in zip(named, rows, strict=True):
        chunk = size // (tensor.numel() // tensor.shape[0])
        rows_of_all = segments[:, offset : offset + size].reshape(ranks * chunk, *tensor.shape[1:])
        full.append((name, rows_of_all[: tensor.shape[0]]))
        offset += size
    return full


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
