"""Host-to-device copies that do not wait for the GPU's queued work."""

from __future__ import annotations

import torch


def host_to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`tensor` on `device`; to a GPU through pinned memory, so the copy does not wait for queued work."""
    if device.type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)
