"""Gated MLPs whose hidden width is not a multiple of 8 run on zero-padded weights (GPU training only).

Qwen2.5-VL's vision blocks have a 3,420-wide MLP. A bf16 row of 3,420 values is 6,840 bytes, not a
multiple of 16, so cuBLAS cannot use Hopper's tensor-memory loads for the three matmuls that touch it and
falls back to older, slower kernels (docs/fsdp.md). `align_gated_mlps` makes such an MLP compute on
weights padded with zeros to the next multiple of 8. The padded units get zero pre-activations, so they
output silu(0)·0 = 0 and receive zero gradients: the result, the gradients and the parameters (names,
shapes, values) are unchanged.

The change is a class swap, to one padded subclass per MLP class (`models.with_mixin`), rather than a
per-instance `forward`: `torch.compile` guards on a module's `forward` object, and 32 different bound
forwards made every vision block recompile until the recompile limit sent the rest to eager mode.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vistarl.trainer.learner.models import with_mixin

ALIGN = 8
"""bf16 elements in 16 bytes."""


def align_gated_mlps(model: nn.Module) -> int:
    """Let every gated MLP in `model` (`gate_proj`, `up_proj`, `down_proj`) with a misaligned width
    compute on padded weights; returns how many were changed."""
    changed = 0
    for module in model.modules():
        projections = [getattr(module, name, None) for name in ("gate_proj", "up_proj", "down_proj")]
        if not all(isinstance(p, nn.Linear) for p in projections):
            continue
        if projections[0].out_features % ALIGN and not isinstance(module, PaddedGatedMLP):  # type: ignore[union-attr]
            with_mixin(module, PaddedGatedMLP)
            changed += 1
    return changed


class PaddedGatedMLP(nn.Module):
    """Mixin: `down(act(gate(x)) * up(x))` with the hidden width padded to a multiple of `ALIGN`."""

    gate_proj: nn.Linear
    up_proj: nn.Linear
    down_proj: nn.Linear
    act_fn: nn.Module

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        pad = -self.gate_proj.out_features % ALIGN
        gate = _padded_linear(hidden, self.gate_proj, pad)
        up = _padded_linear(hidden, self.up_proj, pad)
        down = self.down_proj
        return F.linear(self.act_fn(gate) * up, F.pad(down.weight, (0, pad)), down.bias)


def _padded_linear(hidden: torch.Tensor, linear: nn.Linear, pad: int) -> torch.Tensor:
    """`linear(hidden)` with `pad` zero output units appended."""
    bias = None if linear.bias is None else F.pad(linear.bias, (0, pad))
    return F.linear(hidden, F.pad(linear.weight, (0, 0, 0, pad)), bias)
