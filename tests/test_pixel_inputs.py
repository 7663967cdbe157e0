"""`VLProcessor.pixel_inputs`: images at their resized size skip the image processor's per-image overhead
and get exactly its patches; other images go through it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vistarl.clients.images import encode_image
from vistarl.devtools.tiny_checkpoint import ARCHS
from vistarl.trainer.rollout.processor import VLProcessor


def noise(rng: np.random.Generator, width: int, height: int) -> Image.Image:
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


@pytest.mark.parametrize("arch", ARCHS)
def test_pixel_inputs_equal_the_image_processor_bit_for_bit(
    tiny_checkpoints: dict[str, Path], arch: str
) -> None:
    processor = VLProcessor.from_pretrained(tiny_checkpoints[arch])
    factor = processor.patch_size * processor.merge_size
    rng = np.random.default_rng(0)
    on_grid = [noise(rng, factor * w, factor * h) for w, h in [(6, 9), (6, 6), (12, 4)]]
    off_grid = [*on_grid[:1], noise(rng, 100, 70)]
    for images in (on_grid, off_grid):
        ours = processor.pixel_inputs(images)
        theirs = processor.image_processor(images=images, return_tensors="pt")  # type: ignore[operator]
        assert ours.pixel_values.dtype == theirs["pixel_values"].dtype == torch.float32
        assert torch.equal(ours.pixel_values, theirs["pixel_values"])
        assert torch.equal(ours.image_grid_thw, theirs["image_grid_thw"])


def test_on_grid_images_skip_the_image_processor(tiny_qwen25: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fast path is the one taken for images at their resized size (the equality above could
    otherwise hold by never leaving the image processor)."""
    processor = VLProcessor.from_pretrained(tiny_qwen25)
    factor = processor.patch_size * processor.merge_size
    rng = np.random.default_rng(1)
    calls: list[int] = []
    kind = type(processor.image_processor)
    original = kind.__call__

    def counted(self: object, *args: object, **kwargs: object) -> object:
        calls.append(len(kwargs.get("images", [])))  # type: ignore[arg-type]
        return original(self, *args, **kwargs)

    monkeypatch.setattr(kind, "__call__", counted)
    processor.pixel_inputs([noise(rng, factor * 4, factor * 3)])
    assert calls == []
    processor.pixel_inputs([noise(rng, factor * 4, factor * 3), noise(rng, 50, 50)])
    assert calls == [1]


def test_a_data_url_is_preprocessed_once(tiny_qwen25: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The samples of a group share their first image: its patches are computed once, and every
    request gets its own copy of them in the concatenated inputs."""
    processor = VLProcessor.from_pretrained(tiny_qwen25)
    factor = processor.patch_size * processor.merge_size
    rng = np.random.default_rng(2)
    shared, other = (encode_image(noise(rng, factor * 3, factor * 2)) for _ in range(2))
    computed: list[int] = []
    patches = processor._patches
    monkeypatch.setattr(processor, "_patches", lambda image: computed.append(1) or patches(image))
    first = processor.pixel_inputs([shared, other, shared])
    second = processor.pixel_inputs([shared])
    assert len(computed) == 2
    rows = first.pixel_values.shape[0] // 3
    assert torch.equal(first.pixel_values[:rows], first.pixel_values[2 * rows :])
    assert torch.equal(second.pixel_values, first.pixel_values[:rows])
    second.pixel_values.zero_()
    assert torch.equal(processor.pixel_inputs([shared]).pixel_values, first.pixel_values[:rows])
