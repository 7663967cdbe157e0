"""What rank 0 tells the other ranks of a torchrun job: its bytes on every rank, by a tensor broadcast.

The RL loop sends its rank commands this way (`vistarl.trainer.run.rank_commands`), and both loops the run
directory they agree on (`vistarl.trainer.run.directory`). Outside torchrun there is one rank and nothing is
sent.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from vistarl.trainer.learner.fsdp import is_distributed

__all__ = ["broadcast_bytes", "current_rank"]


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
