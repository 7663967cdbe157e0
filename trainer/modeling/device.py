"""Host-to-device copies that do not wait for the GPU's queued work, a thread's own CUDA device, and how
soon a thread driving a GPU gets the GIL back."""

from __future__ import annotations

import sys

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


def shorten_switch_interval(milliseconds: float, device: torch.device) -> None:
    """For a thread driving a GPU at `device`, lower the process's GIL switch interval to at most
    `milliseconds` (0: leave it; nothing on the CPU, where torch calls are work, not launches). Each torch
    call gives the GIL up, and takes it back only once a thread running Python beside it has been made to
    drop it, which the interpreter asks for after one interval (5 ms by default): an eager pass of a
    thousand calls then waits seconds (`python -m benchmarks.gil_switch`)."""
    if milliseconds < 0:
        raise ValueError(f"gil_switch_ms must be >= 0 (0: leave Python's), got {milliseconds}")
    if milliseconds > 0 and device.type == "cuda":
        sys.setswitchinterval(min(sys.getswitchinterval(), milliseconds / 1000))
