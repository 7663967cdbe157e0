"""Qwen-VL text + image processing for rollout and training, without torchvision.

`VLProcessor` pairs the checkpoint's tokenizer with its image processor (the PIL backend) and
answers the questions the two token tracks need: how many `<|image_pad|>` tokens an image expands
to (from its size alone, so the rollout never touches pixels), and the `pixel_values` /
`image_grid_thw` a forward pass needs.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import io
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cachetools
import numpy as np
import torch
from PIL import Image
from transformers import AutoImageProcessor, AutoTokenizer, PreTrainedTokenizerBase
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

from vistarl.clients.images import decode_image

ImageLike = str | Image.Image
Grid = tuple[int, int, int]

# Bounds on images that reach the processor from environments: far above any VLM input size.
MAX_IMAGE_BYTES = 32 * 1024 * 1024
MAX_IMAGE_PIXELS = 64 * 1024 * 1024
_HEADER_CHARS = 4096  # base64 characters read for a header: a multiple of 4
PIXEL_CACHE_BYTES = 1 << 30  # pixel inputs a processor keeps, by data URL: every image of a rollout step
CONTENT_KEY_CACHE_SIZE = 1024  # data URLs whose content keys a processor keeps (every turn resends them all)


@dataclass(frozen=True)
class SpecialIds:
    """The Qwen chat and vision special-token ids, read from the tokenizer."""

    im_start: int
    im_end: int
    vision_start: int
    vision_end: int
    image_pad: int
    newline: int

    @classmethod
    def from_tokenizer(cls, tokenizer: PreTrainedTokenizerBase) -> SpecialIds:
        def token_id(text: str) -> int:
            ids = tokenizer.encode(text, add_special_tokens=False)
            if len(ids) != 1:
                raise ValueError(f"tokenizer encodes {text!r} as {ids}, expected one token")
            return int(ids[0])

        return cls(
            im_start=token_id("<|im_start|>"),
            im_end=token_id("<|im_end|>"),
            vision_start=token_id("<|vision_start|>"),
            vision_end=token_id("<|vision_end|>"),
            image_pad=token_id("<|image_pad|>"),
            newline=token_id("\n"),
        )


@dataclass(frozen=True)
class PixelInputs:
    """What the vision tower consumes: flattened patches and one (t, h, w) row per image."""

    pixel_values: torch.Tensor
    image_grid_thw: torch.Tensor


def concat_pixels(parts: Sequence[PixelInputs], pin_memory: bool = False) -> PixelInputs:
    """The pixel inputs of several images as one batch, in order; with `pin_memory` concatenated straight
    into pinned memory, for a batch bound for a GPU (one copy, not a concatenation and a pinned copy)."""
    patches = [p.pixel_values for p in parts]
    out = None
    if pin_memory:
        rows = sum(int(p.shape[0]) for p in patches)
        out = torch.empty((rows, *patches[0].shape[1:]), dtype=patches[0].dtype, pin_memory=True)
    return PixelInputs(torch.cat(patches, out=out), torch.cat([p.image_grid_thw for p in parts]))


class VLProcessor:
    """Tokenizer + image processor of one checkpoint, loaded through `from_pretrained`."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, image_processor: object) -> None:
        self.tokenizer = tokenizer
        self.image_processor = image_processor
        self.ids = SpecialIds.from_tokenizer(tokenizer)
        pixels: cachetools.LRUCache[str, PixelInputs] = cachetools.LRUCache(
            PIXEL_CACHE_BYTES, getsizeof=lambda p: max(1, p.pixel_values.nbytes)
        )
        self._cached_pixels = cachetools.cached(pixels, lock=threading.Lock())(self._pixels)
        self._cached_content_key = functools.lru_cache(maxsize=CONTENT_KEY_CACHE_SIZE)(self._content_key)
        self.patch_size = int(image_processor.patch_size)  # type: ignore[attr-defined]
        self.merge_size = int(image_processor.merge_size)  # type: ignore[attr-defined]
        size = image_processor.size  # type: ignore[attr-defined]
        self.min_pixels = int(size["shortest_edge"])
        self.max_pixels = int(size["longest_edge"])

    @classmethod
    def from_pretrained(cls, path: str | Path) -> VLProcessor:
        """Load from a local checkpoint directory (tiny or real Qwen2.5-VL / Qwen3-VL); never from a hub,
        so a missing directory fails at once instead of waiting on the network."""
        directory = checkpoint_dir(path)
        tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
        image_processor = AutoImageProcessor.from_pretrained(directory, backend="pil", local_files_only=True)
        return cls(tokenizer, image_processor)

    def grid_for_size(self, height: int, width: int) -> Grid:
        """The (t, h, w) patch grid of a still image of this size, after Qwen's smart resize."""
        factor = self.patch_size * self.merge_size
        h, w = smart_resize(height, width, factor, min_pixels=self.min_pixels, max_pixels=self.max_pixels)
        return (1, h // self.patch_size, w // self.patch_size)

    def image_grid(self, image: ImageLike) -> Grid:
        """The patch grid of an image, reading only its header when given a data URL."""
        if isinstance(image, Image.Image):
            return self.grid_for_size(image.height, image.width)
        width, height = image_size(image)
        return self.grid_for_size(height, width)

    def num_image_tokens(self, grid: Sequence[int]) -> int:
        """How many `<|image_pad|>` tokens an image with this grid expands to: t·h·w / merge²."""
        t, h, w = grid
        return t * h * w // (self.merge_size**2)

    def expand_image_pads(self, ids: Sequence[int], grids: Sequence[Sequence[int]]) -> list[int]:
        """Replace the single pad of image k by `num_image_tokens(grids[k])` pads. The pads are found by
        `list.index` and the runs between them copied as slices: a prompt's tokens are not walked in
        Python (this runs for every episode's prompt, beside the GRPO update's torch calls)."""
        ids, pad = list(ids), self.ids.image_pad
        out: list[int] = []
        start = 0
        for k, grid in enumerate(grids):
            try:
                at = ids.index(pad, start)
            except ValueError:
                raise ValueError(f"{k} image pads for {len(grids)} images") from None
            out += ids[start:at]
            out += [pad] * self.num_image_tokens(grid)
            start = at + 1
        rest = ids[start:]
        if pad in rest:
            raise ValueError(f"more image pads than images ({len(grids)})")
        return out + rest

    def pixel_inputs(self, images: Sequence[ImageLike]) -> PixelInputs:
        """Preprocess images (in pad order) into `pixel_values` and `image_grid_thw` (`image_inputs`,
        concatenated)."""
        parts = self.image_inputs(images)
        if not parts:
            out = self.image_processor(images=[], return_tensors="pt")  # type: ignore[operator]
            return PixelInputs(pixel_values=out["pixel_values"], image_grid_thw=out["image_grid_thw"])
        return concat_pixels(parts)

    def image_inputs(self, images: Sequence[ImageLike]) -> list[PixelInputs]:
        """Each image's pixel inputs, preprocessed on its own; a data URL's once while it is among the last
        `PIXEL_CACHE_BYTES` of inputs used: the samples of a GRPO group share their first observation, every
        turn of an episode resends the earlier turns' images, and the engine and the trainer both ask. A
        count of entries would not do: a step of 16 eight-turn episodes holds 128 images, and a cache of
        fewer misses on every one of them, turn after turn."""
        return [self._cached_pixels(img) if isinstance(img, str) else self._pixels(img) for img in images]

    def content_keys(self, images: Sequence[ImageLike]) -> list[int]:
        """A 63-bit key of each image's content: a hash of the pixel inputs the vision tower takes and their
        grid, by which the HF engine's prefix cache tells images apart (SGLang's hashes them too); a data
        URL's is kept for the last `CONTENT_KEY_CACHE_SIZE` seen."""
        return [
            self._cached_content_key(img) if isinstance(img, str) else self._content_key(img)
            for img in images
        ]

    def _content_key(self, image: ImageLike) -> int:
        """One image's content key (`content_keys`)."""
        pixels = self._cached_pixels(image) if isinstance(image, str) else self._pixels(image)
        digest = hashlib.blake2b(pixels.image_grid_thw.numpy().astype(np.int64).tobytes(), digest_size=8)
        digest.update(pixels.pixel_values.numpy().tobytes())
        return int.from_bytes(digest.digest(), "little") >> 1

    def _pixels(self, image: ImageLike) -> PixelInputs:
        """One image's inputs. An image already at its resized size (an env that renders to the patch
        grid) takes `_patches`, the image processor's own arithmetic without its per-image overhead;
        any other goes through the image processor."""
        pil = load_image(image)
        if self._needs_no_resize(pil):
            grid = [[1, pil.height // self.patch_size, pil.width // self.patch_size]]
            return PixelInputs(torch.from_numpy(self._patches(pil)), torch.tensor(grid))
        out = self.image_processor(images=[pil], return_tensors="pt")  # type: ignore[operator]
        return PixelInputs(pixel_values=out["pixel_values"], image_grid_thw=out["image_grid_thw"])

    def _needs_no_resize(self, image: Image.Image) -> bool:
        """Whether the Qwen2-VL PIL image processor would only rescale and normalize this image."""
        processor: Any = self.image_processor
        if type(processor).__name__ != "Qwen2VLImageProcessorPil":
            return False
        if not (processor.do_rescale and processor.do_normalize):
            return False
        factor = self.patch_size * self.merge_size
        size = smart_resize(
            image.height, image.width, factor, min_pixels=self.min_pixels, max_pixels=self.max_pixels
        )
        return size == (image.height, image.width)

    def _patches(self, image: Image.Image) -> np.ndarray:
        """The image processor's flattened patches of an RGB image that needs no resize: rescaled in
        float64 and cast, normalized in float32, cut into merge-ordered patches repeated over time."""
        processor: Any = self.image_processor
        pixels = (np.asarray(image).astype(np.float64) * processor.rescale_factor).astype(np.float32)
        pixels = (pixels - np.array(processor.image_mean, dtype=np.float32)) / np.array(
            processor.image_std, dtype=np.float32
        )
        p, m, t = self.patch_size, self.merge_size, int(processor.temporal_patch_size)
        h, w = image.height // p, image.width // p
        grid = pixels.transpose(2, 0, 1).reshape(3, h // m, m, p, w // m, m, p)
        grid = grid.transpose(1, 4, 2, 5, 0, 3, 6)[:, :, :, :, :, None]
        return np.ascontiguousarray(np.broadcast_to(grid, (*grid.shape[:5], t, p, p))).reshape(h * w, -1)


def checkpoint_dir(path: str | Path) -> str:
    """`path` as an absolute checkpoint directory (symlinks kept, as other hosts may mount them);
    FileNotFoundError naming it if there is none here."""
    directory = Path(os.path.abspath(Path(path).expanduser()))
    if not directory.is_dir():
        raise FileNotFoundError(
            f"checkpoint directory {str(path)!r} does not exist here ({directory}); vistarl loads models "
            "from local directories only and downloads nothing"
        )
    return str(directory)


def load_image(image: ImageLike) -> Image.Image:
    """A PIL image from a PIL image or a data URL, decoded within the project's size limits."""
    if isinstance(image, Image.Image):
        return image.convert("RGB") if image.mode != "RGB" else image
    return decode_image(image, max_bytes=MAX_IMAGE_BYTES, max_pixels=MAX_IMAGE_PIXELS).convert("RGB")


def image_size(data_url: str) -> tuple[int, int]:
    """(width, height) of an encoded image, read from its header without decoding the pixels.

    PNG and most JPEG headers sit in the first few kilobytes; anything else is fully decoded
    (within limits) instead.
    """
    payload = data_url.split(",", 1)[1] if data_url.startswith("data:") else data_url
    try:
        with Image.open(io.BytesIO(base64.b64decode(payload[:_HEADER_CHARS]))) as img:
            return img.size
    except (OSError, ValueError):
        return load_image(data_url).size
