"""Vision-tower inputs precomputed on the host: the tower's own output, without reading the grid."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.vl_samples import mixed_samples
from vistarl.devtools.tiny_checkpoint import ARCHS
from vistarl.trainer.learner.models import load_lm
from vistarl.trainer.modeling.vision_inputs import _vision_inputs, vision_inputs
from vistarl.trainer.rollout.processor import VLProcessor


@pytest.mark.parametrize("arch", ARCHS)
def test_precomputed_inputs_reproduce_the_tower_without_the_grid(
    tiny_checkpoints: dict[str, Path], arch: str
) -> None:
    path = tiny_checkpoints[arch]
    lm, processor = load_lm(path), VLProcessor.from_pretrained(path)
    images = [image for sample in mixed_samples(processor) for image in sample.images]
    pixels = processor.pixel_inputs(images)
    grid = pixels.image_grid_thw
    assert any(h != w for _, h, w in grid.tolist())  # so a grid with h and w swapped is a different grid
    inputs = vision_inputs(lm.model.visual, grid, torch.device("cpu"))
    assert all(name.startswith("image_") for name in inputs)
    with torch.no_grad():
        own = lm.model.get_image_features(pixels.pixel_values, grid).pooler_output
        given = lm.model.get_image_features(pixels.pixel_values, grid, **inputs).pooler_output
        # A wrong grid of the same shape is ignored everywhere but the final split: the tower read
        # nothing from it, so it had nothing to wait for on a GPU.
        wrong = torch.stack([grid[:, 0], grid[:, 2], grid[:, 1]], dim=1)
        blind = lm.model.get_image_features(pixels.pixel_values, wrong, **inputs).pooler_output
    for a, b, c in zip(own, given, blind, strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-6)
        torch.testing.assert_close(c, a, rtol=0, atol=1e-6)


@pytest.mark.parametrize("arch", ARCHS)
def test_inputs_are_made_once_per_grid_and_equal_fresh_ones(
    tiny_checkpoints: dict[str, Path], arch: str
) -> None:
    """Equal grids take the inputs already made (the same tensors, read only), which equal fresh ones; a
    different grid gets its own."""
    visual = load_lm(tiny_checkpoints[arch]).model.visual
    grid = torch.tensor([[1, 8, 12], [1, 8, 12]])
    first = vision_inputs(visual, grid, torch.device("cpu"))
    again = vision_inputs(visual, grid.clone(), torch.device("cpu"))
    assert first is not again and all(again[name] is value for name, value in first.items())
    _vision_inputs.cache_clear()
    fresh = vision_inputs(visual, grid, torch.device("cpu"))
    assert fresh.keys() == first.keys()
    for name, value in first.items():
        if isinstance(value, torch.Tensor):
            assert fresh[name] is not value and torch.equal(fresh[name], value)
        else:
            assert fresh[name] == value
    other = vision_inputs(visual, torch.tensor([[1, 12, 8], [1, 8, 12]]), torch.device("cpu"))
    assert not torch.equal(other["image_position_ids"], first["image_position_ids"])


@pytest.mark.parametrize("arch", ARCHS)
def test_inputs_made_in_inference_mode_serve_a_forward_with_gradients(
    tiny_checkpoints: dict[str, Path], arch: str
) -> None:
    """The engine's prompt pass asks under inference mode, and the learner may take the same inputs next
    and save them for backward: they are made as ordinary tensors."""
    path = tiny_checkpoints[arch]
    lm, processor = load_lm(path), VLProcessor.from_pretrained(path)
    pixels = processor.pixel_inputs([image for sample in mixed_samples(processor) for image in sample.images])
    grid = pixels.image_grid_thw
    _vision_inputs.cache_clear()
    with torch.inference_mode():
        made = vision_inputs(lm.model.visual, grid, torch.device("cpu"))
    inputs = vision_inputs(lm.model.visual, grid, torch.device("cpu"))
    assert all(inputs[name] is value for name, value in made.items())
    pixel_values = pixels.pixel_values.clone().requires_grad_()
    features = lm.model.get_image_features(pixel_values, grid, **inputs).pooler_output
    torch.cat(list(features)).sum().backward()
    assert pixel_values.grad is not None and pixel_values.grad.abs().sum() > 0
