"""Deterministic multi-turn-shaped token sequences with images, for packing, logprob and FSDP tests."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from PIL import Image

from vistarl.trainer.learner.packing import SequenceSample
from vistarl.trainer.rollout.processor import VLProcessor

TEXT_VOCAB = 150_000  # ordinary BPE ids, below Qwen's special tokens


def noise_image(rng: np.random.Generator, width: int, height: int) -> Image.Image:
    """An RGB image of random pixels."""
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


def make_sample(
    processor: VLProcessor,
    rng: np.random.Generator,
    prompt_len: int,
    response_len: int,
    image_sizes: Sequence[tuple[int, int]] = (),
) -> SequenceSample:
    """`<|im_start|>`, the images (pads expanded), a random prompt, then a scored random response."""
    images = [noise_image(rng, w, h) for w, h in image_sizes]
    ids = processor.ids
    prompt = [ids.im_start]
    for _ in images:
        prompt += [ids.vision_start, ids.image_pad, ids.vision_end]
    prompt += rng.integers(0, TEXT_VOCAB, prompt_len).tolist()
    prompt = processor.expand_image_pads(prompt, [processor.image_grid(image) for image in images])
    response = rng.integers(0, TEXT_VOCAB, response_len).tolist()
    return SequenceSample(
        train_ids=prompt + response,
        loss_mask=[0] * len(prompt) + [1] * response_len,
        images=images,
        rollout_logprobs=(-rng.random(len(prompt) + response_len)).tolist(),
        advantages=[0.0] * len(prompt) + [float(rng.normal())] * response_len,
    )


def mixed_samples(processor: VLProcessor, seed: int = 0) -> list[SequenceSample]:
    """Three sequences of different lengths: one image, no image, two images of different sizes."""
    rng = np.random.default_rng(seed)
    return [
        make_sample(processor, rng, 9, 11, [(60, 40)]),
        make_sample(processor, rng, 5, 4),
        make_sample(processor, rng, 12, 17, [(40, 40), (84, 56)]),
    ]
