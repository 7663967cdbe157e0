"""What the ranks of a torchrun job tell each other: rank 0's bytes on every rank (a tensor broadcast), or
every rank's on every rank (an all-gather).

The RL loop sends its rank commands this way (`vistarl.trainer.run.rank_commands`), and both loops the run
directory they agree on (`vistarl.trainer.run.directory`); the ranks that serve an engine tell rank 0
where (`vistarl.trainer.run.rank_engines`). Outside torchrun there is one rank and nothing is sent.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from vistarl.trainer.learner.fsdp import is_distributed

__all__ = ["broadcast_bytes", "current_rank", "gather_bytes"]


def current_rank() -> int:
    """This process's rank (0 outside torchrun)."""
    return dist.get_rank() if is_distributed() else 0


def broadcast_bytes(payload: bytes | None, device: torch.device) -> bytes:
    """Rank 0's `payload` on every rank (the others pass None): its size, then its bytes as a uint8
    tensor on `device` (no pickle). Outside torchrun `payload` comes back as it is."""
    if not is_distributed():
        assert payload is not None, "rank 0 gives the payload"
        return payload
    data = (payload or b"") if dist.get_rank() == 0 else b""
    size = torch.tensor([len(data)], dtype=torch.long, device=device)
    dist.broadcast(size, src=0)
    buffer = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    if data:
        buffer.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    dist.broadcast(buffer, src=0)
    return buffer.cpu().numpy().tobytes()


def gather_bytes(payload: bytes, device: torch.device) -> list[bytes]:
    """Every rank's `payload`, in rank order, on every rank: their sizes, then their bytes padded to the
    largest, each gathered in one collective (no pickle). Outside torchrun, `[payload]`."""
    if not is_distributed():
        return [payload]
    world = dist.get_world_size()
    size = torch.tensor([len(payload)], dtype=torch.long, device=device)
    sizes = [torch.empty_like(size) for _ in range(world)]
    dist.all_gather(sizes, size)
    longest = max(int(s.item()) for s in sizes)
    buffer = torch.zeros(max(longest, 1), dtype=torch.uint8, device=device)
    if payload:
        buffer[: len(payload)].copy_(torch.frombuffer(bytearray(payload), dtype=torch.uint8))
    buffers = [torch.empty_like(buffer) for _ in range(world)]
    dist.all_gather(buffers, buffer)
    return [b.cpu().numpy().tobytes()[: int(s.item())] for b, s in zip(buffers, sizes, strict=True)]
