"""What the ranks of a torchrun job tell each other: rank 0's bytes on every rank (a broadcast), or every
rank's on every rank (an all-gather), over a gloo group of their own, on the CPU.

The RL loop sends its rank commands this way (`vistarl.trainer.run.rank_commands`), and both loops the run
directory they agree on (`vistarl.trainer.run.directory`); the ranks that serve an engine tell rank 0
where (`vistarl.trainer.run.rank_engines`). Outside torchrun there is one rank and nothing is sent.

Why a group of their own: a rank that waits for rank 0's next command waits through a whole rollout. On
NCCL that wait is a kernel spinning on the rank's GPU, which takes streaming multiprocessors from the
engine the rank serves meanwhile, and which a device-wide synchronisation of the engine's (a CUDA graph's
capture begins with one) waits for, while rank 0 waits for that engine: a deadlock. On the CPU the wait
holds no GPU, and it may last as long as a rollout and an evaluation take (`COMMAND_TIMEOUT`).
"""

from __future__ import annotations

import functools
import os
from datetime import timedelta

import torch
import torch.distributed as dist

from vistarl.trainer.learner.fsdp import is_distributed

__all__ = ["COMMAND_TIMEOUT", "barrier", "broadcast_bytes", "current_rank", "gather_bytes", "one_node"]

COMMAND_TIMEOUT = timedelta(hours=2)
"""How long a rank waits for rank 0's next message: through a rollout and an evaluation, never forever."""


def current_rank() -> int:
    """This process's rank (0 outside torchrun)."""
    return dist.get_rank() if is_distributed() else 0


def one_node() -> bool:
    """Whether every rank of the job runs on this node (torchrun's `LOCAL_WORLD_SIZE` is the world's size);
    True outside torchrun."""
    return not dist.is_initialized() or int(os.environ.get("LOCAL_WORLD_SIZE", "1")) == dist.get_world_size()


@functools.cache
def _control_group() -> dist.ProcessGroup:
    """Every rank, over gloo: made once, on the first message, which every rank sends in the same order."""
    group = dist.new_group(backend="gloo", timeout=COMMAND_TIMEOUT)
    assert group is not None, "every rank belongs to the control group"
    return group


def barrier() -> None:
    """Return once every rank has come here (at once outside torchrun)."""
    if is_distributed():
        dist.barrier(group=_control_group())


def broadcast_bytes(payload: bytes | None) -> bytes:
    """Rank 0's `payload` on every rank (the others pass None): its size, then its bytes as a uint8 tensor
    (no pickle). Outside torchrun `payload` comes back as it is."""
    if not is_distributed():
        assert payload is not None, "rank 0 gives the payload"
        return payload
    group = _control_group()
    data = (payload or b"") if dist.get_rank() == 0 else b""
    size = torch.tensor([len(data)], dtype=torch.long)
    dist.broadcast(size, src=0, group=group)
    buffer = torch.empty(int(size), dtype=torch.uint8)
    if data:
        buffer.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    dist.broadcast(buffer, src=0, group=group)
    return buffer.numpy().tobytes()


def gather_bytes(payload: bytes) -> list[bytes]:
    """Every rank's `payload`, in rank order, on every rank: their sizes, then their bytes padded to the
    largest, each gathered in one collective (no pickle). Outside torchrun, `[payload]`."""
    if not is_distributed():
        return [payload]
    group, world = _control_group(), dist.get_world_size()
    size = torch.tensor([len(payload)], dtype=torch.long)
    sizes = [torch.empty_like(size) for _ in range(world)]
    dist.all_gather(sizes, size, group=group)
    buffer = torch.zeros(max(max(int(s) for s in sizes), 1), dtype=torch.uint8)
    if payload:
        buffer[: len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    buffers = [torch.empty_like(buffer) for _ in range(world)]
    dist.all_gather(buffers, buffer, group=group)
    return [b.numpy().tobytes()[: int(s)] for b, s in zip(buffers, sizes, strict=True)]
