"""An engine's parameters as the target of a load: every name and shape is checked before anything is
written, so a wrong push changes nothing."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch

__all__ = ["Load", "WeightLoadError", "copy_into", "load_targets"]

Load = Callable[[Mapping[str, torch.Tensor]], None]
"""A load: what is written into an engine's live tensors, given them by live name (`copy_into`, a bucket
received over NCCL)."""


class WeightLoadError(ValueError):
    """Pushed weights that do not fit the engine's model (an unknown name, another shape)."""


def load_targets(
    live: Mapping[str, torch.Tensor], names: Sequence[str], shapes: Sequence[Sequence[int]]
) -> list[torch.Tensor]:
    """The live tensors that `names` (live names) with `shapes` are loaded into, in order."""
    unknown = sorted(set(names) - set(live))
    if unknown:
        raise WeightLoadError(f"unknown parameter names: {', '.join(unknown[:5])}")
    for name, shape in zip(names, shapes, strict=True):
        if tuple(shape) != tuple(live[name].shape):
            raise WeightLoadError(
                f"shape mismatch for {name}: got {tuple(shape)}, model has {tuple(live[name].shape)}"
            )
    return [live[name] for name in names]


def copy_into(live: Mapping[str, torch.Tensor], tensors: Mapping[str, torch.Tensor]) -> None:
    """Copy `tensors` (live names) into the live tensors, casting and moving as needed (device to device
    when both sides are on one GPU)."""
    targets = load_targets(live, list(tensors), [t.shape for t in tensors.values()])
    with torch.no_grad():
        for target, tensor in zip(targets, tensors.values(), strict=True):
            target.copy_(tensor)
