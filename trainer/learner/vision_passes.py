"""The vision tower run once for several micro-batches: fewer, larger tower passes per optimizer step.

A 3B Qwen-VL vision block does about a tenth of a decoder layer's work on one 8k-token micro-batch's
images, so the GPU finishes each of its kernels before the host has launched the next: run per
micro-batch, the tower's forward, recompute and backward left the GPU idle for about a quarter of an
update step (docs/benchmarks.md). `VisionPasses` encodes the images of `group` consecutive
micro-batches in one tower forward, hands each micro-batch its rows as fresh autograd leaves, and
after the group's last micro-batch sends the gradients those leaves collected back through the tower
in one backward. Gradients are sums, so the result is the same as one tower pass per micro-batch.

    vision = VisionPasses(actor, batches, group=4)
    for i, batch in enumerate(batches):
        loss_of(token_logprobs(actor, batch, t, image_features=vision.features(i))).backward()
        vision.backward(i)

Groups are fixed runs of micro-batch indices, so every rank runs the tower (an FSDP unit, whose
gathers and reduces are collectives) at the same points. Under `torch.no_grad` `backward` does nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import torch

from vistarl.trainer.learner.models import ActorModel, CriticModel
from vistarl.trainer.learner.packing import PackedBatch
from vistarl.trainer.modeling.image_features import ImageFeatures


class VisionPasses:
    """One tower forward per `group` micro-batches of `batches`, run when the group's first is asked
    for, and one tower backward after its last; `model` is an `ActorModel` or `CriticModel`, plain or
    FSDP-sharded."""

    def __init__(self, model: ActorModel | CriticModel, batches: Sequence[PackedBatch], group: int) -> None:
        if group < 1:
            raise ValueError(f"group must be >= 1, got {group}")
        self.model = model
        self.batches = batches
        self.group = group
        self._encoded: ImageFeatures | None = None
        self._parts: list[ImageFeatures | None] = []

    def features(self, index: int) -> ImageFeatures | None:
        """Micro-batch `index`'s image features (None without images), as autograd leaves."""
        start = index - index % self.group
        if index == start:
            self._encode(self.batches[start : start + self.group])
        return self._parts[index - start]

    def backward(self, index: int) -> None:
        """Call after micro-batch `index`'s backward: at the end of a group, backpropagate the gradients
        its leaves collected (zeros where a micro-batch's loss did not reach them) through the tower."""
        if index != min(index - index % self.group + self.group, len(self.batches)) - 1:
            return
        encoded, parts = self._encoded, self._parts
        self._encoded, self._parts = None, []
        if encoded is None or not encoded.embeds.requires_grad:
            return
        leaves = [part.tensors for part in parts if part is not None]
        grads = [
            torch.cat([t.grad if t.grad is not None else torch.zeros_like(t) for t in kind])
            for kind in zip(*leaves, strict=True)
        ]
        torch.autograd.backward(encoded.tensors, grads)

    def _encode(self, batches: Sequence[PackedBatch]) -> None:
        """One tower forward over the images of `batches`, split back into their rows."""
        images = [
            i for i, b in enumerate(batches) if b.pixel_values is not None and b.image_grid_thw is not None
        ]
        self._parts = [None] * len(batches)
        self._encoded = None
        if not images:
            return
        pixel_values = torch.cat([cast(torch.Tensor, batches[i].pixel_values) for i in images])
        grid = torch.cat([cast(torch.Tensor, batches[i].image_grid_thw) for i in images])
        # Host ints, as `PackedBatch.forward_inputs` sends the grid: FSDP would move a tensor to the GPU.
        encoded: ImageFeatures = self.model.encode_images(pixel_values, grid.tolist())
        parts = encoded.split([batches[i].image_positions.numel() for i in images])
        for i, part in zip(images, parts, strict=True):
            self._parts[i] = part.detached()
        self._encoded = encoded
