"""Activation checkpointing: which activations the decoder layers and vision blocks keep for backward.

Checkpointing is non-reentrant, which composes with FSDP2 and `torch.compile`. Two scopes:

- `"layer"` (HF's gradient checkpointing): every block keeps only its input and recomputes its whole
  forward in backward. The least memory.
- `"mlp"`: vision blocks as above, but each decoder layer keeps its attention block's activations and
  recomputes only its MLP. Backward no longer runs the attention, the q/k/v/o projections, rotary and
  the first norm again, about a third of a layer's recompute, for about 0.2 GB more per layer per 8k
  tokens in a 3B model (the MLP's 11k-wide intermediates, the bulk of a layer's activations, are
  still recomputed).

Either way the last `uncheckpointed` decoder layers keep everything. The MLP scope is a class swap to a
checkpointing subclass (`models.with_mixin`), not a per-instance `forward`, so that compiled layers
share one traced MLP and `torch.compile` sees the checkpoint inside the layer it compiles.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from vistarl.trainer.learner.models import ActorModel, CriticModel, with_mixin

CheckpointScope = Literal["layer", "mlp"]


class CheckpointedMLP(nn.Module):
    """Mixin: the MLP's own forward, run under checkpointing (its activations recomputed in backward)."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return checkpoint(super().forward, hidden, use_reentrant=False)


def enable_gradient_checkpointing(
    module: ActorModel | CriticModel, uncheckpointed_layers: int = 0, scope: CheckpointScope = "layer"
) -> None:
    """Checkpoint every vision block and decoder layer at `scope`, except the last `uncheckpointed_layers`
    decoder layers, which keep their activations: less recompute, more memory."""
    backbone = module.model
    layers = backbone.language_model.layers
    if not 0 <= uncheckpointed_layers <= len(layers):
        raise ValueError(f"uncheckpointed_layers must be in [0, {len(layers)}], got {uncheckpointed_layers}")
    if scope not in ("layer", "mlp"):
        raise ValueError(f"checkpoint scope must be 'layer' or 'mlp', got {scope!r}")
    # transformers 5.2x renamed the method; the options dict is the first argument of both.
    enable = (
        getattr(backbone, "activation_checkpointing_enable", None) or backbone.gradient_checkpointing_enable
    )
    enable({"use_reentrant": False})
    checkpointed = len(layers) - uncheckpointed_layers
    for layer in layers[checkpointed:]:
        layer.gradient_checkpointing = False
    if scope == "mlp":
        for layer in layers[:checkpointed]:
            layer.gradient_checkpointing = False
            with_mixin(layer.mlp, CheckpointedMLP)
