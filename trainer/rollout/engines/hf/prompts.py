"""A request made ready for the HF engine's prompt pass, off the model thread: ids checked, images decoded
and their pads expanded, stop ids chosen, the prompt's mRoPE positions found, and its key in the prefix
cache (`prefix_cache.py`) built."""

from __future__ import annotations

import bisect
import threading
from collections.abc import Hashable
from dataclasses import dataclass

import cachetools
import numpy as np
import torch
from transformers import PreTrainedModel

from vistarl.clients.errors import ImageError
from vistarl.trainer.rollout.engines.base import EngineRequestError, GenerateRequest
from vistarl.trainer.rollout.engines.hf.loading import eos_ids
from vistarl.trainer.rollout.engines.hf.prefix_cache import PromptKey
from vistarl.trainer.rollout.processor import PixelInputs, VLProcessor

LAYOUT_CACHE_SIZE = 256  # prompt layouts a `PromptRules` keeps: every first prompt of a step's groups


@dataclass(frozen=True)
class Rest:
    """What a prompt pass computes of a prompt whose first tokens came from the prefix cache: the other ids,
    their mRoPE positions `[3, 1, R]`, and the pixel inputs of the images among them."""

    input_ids: list[int]
    positions: torch.Tensor
    images: tuple[PixelInputs, ...]


@dataclass(frozen=True)
class Layout:
    """What a prompt's ids and images make of it, whatever its sampling: the expanded ids, their mRoPE
    positions `[3, 1, L]` (from 0) with the offset of the positions after it from its length, the
    prefix-cache key and where each image's pads begin."""

    input_ids: list[int]
    positions: torch.Tensor
    rope_delta: int
    key: PromptKey
    image_starts: tuple[int, ...]


@dataclass(frozen=True)
class Prompt(Layout):
    """A request made ready for the model: its `Layout`, each image's pixel inputs, the ids that stop it."""

    images: tuple[PixelInputs, ...]
    stop_ids: frozenset[int]

    def rest(self, start: int) -> Rest:
        """The prompt from token `start` on, which splits no image (`prefix_cache` reuses whole images): only
        its own images go to the vision tower, not those of the turns before it."""
        images = self.images[bisect.bisect_left(self.image_starts, start) :]
        return Rest(self.input_ids[start:], self.positions[:, :, start:], images)


class PromptRules:
    """What a prompt is checked and laid out against: the model's vocabulary and context, and its EOS ids.

    A prompt's layout is made once for each of the last `LAYOUT_CACHE_SIZE` (ids, images) asked for: the
    samples of a GRPO group send the same first prompt, and `prepare` runs in threads that hold the GIL
    the trainer's update needs."""

    def __init__(
        self,
        model: PreTrainedModel,
        processor: VLProcessor,
        *,
        vocab_size: int,
        max_context_len: int,
        eos_ids: frozenset[int],
    ) -> None:
        self.model = model
        self.processor = processor
        self.vocab_size = vocab_size
        self.max_context_len = max_context_len
        self.eos_ids = eos_ids
        layouts: cachetools.LRUCache[Hashable, Layout] = cachetools.LRUCache(LAYOUT_CACHE_SIZE)
        self._cached_layout = cachetools.cached(layouts, key=_layout_key, lock=threading.Lock())(self._layout)

    @classmethod
    def of(cls, model: PreTrainedModel, processor: VLProcessor) -> PromptRules:
        """The rules of `model`'s vocabulary, its context and its EOS ids."""
        return cls(
            model,
            processor,
            vocab_size=int(model.get_input_embeddings().num_embeddings),
            max_context_len=int(model.config.get_text_config().max_position_embeddings),
            eos_ids=eos_ids(model, processor),
        )

    def prepare(self, request: GenerateRequest) -> Prompt:
        """Check the ids, decode the images, expand each single pad to the image's token count, find the
        prompt's mRoPE positions with the model's `get_rope_index`, and key it for the prefix cache."""
        ids = request.engine_ids
        if ids and (min(ids) < 0 or max(ids) >= self.vocab_size):  # in C: every episode's prompt comes here
            bad = [t for t in ids if not 0 <= t < self.vocab_size]
            raise EngineRequestError(f"token ids out of range [0, {self.vocab_size}): {bad[:5]}")
        pads = ids.count(self.processor.ids.image_pad)
        if pads != len(request.images):
            raise EngineRequestError(
                f"engine_ids hold {pads} <|image_pad|> tokens for {len(request.images)} images; "
                "send exactly one pad per image (single-pad engine_ids)"
            )
        images: list[PixelInputs] = []
        if request.images:
            try:
                images = self.processor.image_inputs(request.images)
            except (ImageError, OSError, ValueError) as exc:
                raise EngineRequestError(f"bad image: {exc}") from exc
        layout = self._cached_layout(ids, request.images, images)
        params = request.sampling
        stop_ids = frozenset() if params.ignore_eos else self.eos_ids | frozenset(params.stop_token_ids or ())
        return Prompt(**vars(layout), images=tuple(images), stop_ids=stop_ids)

    def _layout(self, ids: list[int], urls: list[str], images: list[PixelInputs]) -> Layout:
        """The layout of checked single-pad `ids` whose pads stand for `images` (of `urls`)."""
        try:
            image_keys = self.processor.content_keys(urls)
        except (ImageError, OSError, ValueError) as exc:
            raise EngineRequestError(f"bad image: {exc}") from exc
        grid_thw = torch.cat([image.image_grid_thw for image in images]) if images else None
        input_ids = list(ids)
        if grid_thw is not None:
            input_ids = self.processor.expand_image_pads(ids, grid_thw.tolist())
        if len(input_ids) >= self.max_context_len:
            raise EngineRequestError(
                f"prompt of {len(input_ids)} tokens does not fit the context of {self.max_context_len}"
            )
        row = torch.tensor(input_ids)[None]
        positions, delta = self.model.model.get_rope_index(
            row,
            mm_token_type_ids=(row == self.processor.ids.image_pad).int(),
            image_grid_thw=grid_thw,
        )
        key, starts = self._key(input_ids, grid_thw, image_keys)
        return Layout(input_ids, positions, int(delta), key, starts)

    def _key(
        self, input_ids: list[int], grid_thw: torch.Tensor | None, image_keys: list[int]
    ) -> tuple[PromptKey, tuple[int, ...]]:
        """The expanded prompt's key in the prefix cache, and where each image's pads begin."""
        merged = self.processor.merge_size**2
        per_image = [] if grid_thw is None else [int(n) // merged for n in grid_thw.prod(-1)]
        key = PromptKey.of(input_ids, self.processor.ids.image_pad, image_keys, per_image)
        pads = np.flatnonzero(key.tokens < 0)
        return key, tuple(int(pads[i]) for i in np.cumsum([0, *per_image[:-1]])) if per_image else ()


def _layout_key(ids: list[int], urls: list[str], images: list[PixelInputs]) -> Hashable:
    """A layout's key in the cache: the ids and the images' data URLs (the pixel inputs follow from them)."""
    return (tuple(ids), tuple(urls))
