"""Host-to-device copies that do not wait for the GPU's queued work, and a thread's own CUDA device."""

from __future__ import annotations

import torch


def host_to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`tensor` on `device`; to a GPU through pinned memory, so the copy does not wait for queued work."""
    if device.type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def use_device(device: torch.device) -> None:
    """Make `device` this thread's current CUDA device (a thread starts on device 0, whatever its process
    set): a thread pool's initializer, so that streams, events and graphs made there without a device
    are on the GPU its tensors live on. Nothing on the CPU."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
