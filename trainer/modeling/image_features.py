"""What the vision tower hands the language model, shared by the learner's models and the HF engine:
the image features, how they are computed (layout on the host, `vistarl.trainer.modeling.vision_inputs`) and
how they are written into the token embeddings."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from vistarl.trainer.modeling.vision_inputs import vision_inputs

Grid = torch.Tensor | Sequence[Sequence[int]]
"""`image_grid_thw`: `[images, 3]` (t, h, w) per image, as a tensor or as host ints."""


@dataclass(frozen=True)
class ImageFeatures:
    """What the vision tower hands the language model, one row per image pad token in image order:
    the merged embeddings `[P, H]`, and Qwen3-VL's deepstack levels (none for Qwen2.5-VL)."""

    embeds: torch.Tensor
    deepstack: tuple[torch.Tensor, ...] = ()

    @property
    def tensors(self) -> list[torch.Tensor]:
        """Every tensor, embeddings first."""
        return [self.embeds, *self.deepstack]

    def split(self, rows: Sequence[int]) -> list[ImageFeatures]:
        """Consecutive parts of `rows` rows each (the image tokens of one micro-batch each)."""
        parts = [t.split(list(rows)) for t in self.tensors]
        return [ImageFeatures(embeds, tuple(levels)) for embeds, *levels in zip(*parts, strict=True)]

    def detached(self) -> ImageFeatures:
        """New autograd leaves with the same values, requiring grad when these do: gradients collect on
        them, and reach the tower when handed back to `torch.autograd.backward`."""
        grad = self.embeds.requires_grad
        leaves = [t.detach().requires_grad_(grad) for t in self.tensors]
        return ImageFeatures(leaves[0], tuple(leaves[1:]))


def encode_images(backbone: Any, pixel_values: torch.Tensor, image_grid_thw: Grid) -> ImageFeatures:
    """The vision tower's features for images of `image_grid_thw`, their layout computed on the host
    (`vistarl.trainer.modeling.vision_inputs`) so the tower never waits for the GPU."""
    grid = torch.as_tensor(image_grid_thw, device="cpu")
    inputs = vision_inputs(backbone.visual, grid, pixel_values.device)
    features = backbone.get_image_features(pixel_values, grid, return_dict=True, **inputs)
    deepstack = getattr(features, "deepstack_features", None) or ()
    return ImageFeatures(_rows(features.pooler_output), tuple(_rows(level) for level in deepstack))


def _rows(per_image: torch.Tensor | Sequence[torch.Tensor]) -> torch.Tensor:
    """Every image's feature rows in one tensor: transformers versions return them joined (5.17's
    Qwen3-VL deepstack levels) or one tensor per image."""
    return per_image if isinstance(per_image, torch.Tensor) else torch.cat(list(per_image))


def with_image_features(
    embeds: torch.Tensor, features: ImageFeatures, positions: torch.Tensor
) -> tuple[torch.Tensor, dict[str, object]]:
    """Token embeddings `[1, T, H]` with the image features written at the image pads' `positions`,
    and the text model's extra inputs (Qwen3-VL's deepstack features).

    HF's own forward writes them with `masked_scatter`, whose backward has to ask the GPU how many
    positions the mask holds; `index_copy` with host-known positions does not.
    """
    if features.embeds.shape[0] != positions.numel():
        raise ValueError(
            f"{positions.numel()} image pad tokens but {features.embeds.shape[0]} image features"
        )
    embeds = embeds.index_copy(1, positions, features.embeds.to(embeds.dtype)[None])
    if not features.deepstack:
        return embeds, {}
    return embeds, {
        "visual_pos_masks": torch.zeros(embeds.shape[:2], dtype=torch.bool, device=embeds.device).index_fill(
            1, positions, True
        ),
        "deepstack_visual_embeds": [level.to(embeds.dtype) for level in features.deepstack],
    }
