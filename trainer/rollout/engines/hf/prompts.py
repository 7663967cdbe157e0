"""A request made ready for the HF engine's prompt pass, off the model thread: ids checked, images decoded
and their pads expanded, stop ids chosen, and the prompt's mRoPE positions found."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from vistarl.clients.errors import ImageError
from vistarl.trainer.rollout.engines.base import EngineRequestError, GenerateRequest
from vistarl.trainer.rollout.processor import PixelInputs, VLProcessor


@dataclass(frozen=True)
class Prompt:
    """A request made ready for the model: expanded ids, pixel inputs, the ids that stop it, and its mRoPE
    positions `[3, 1, L]` (from 0) with the offset of the positions after it from its length."""

    input_ids: list[int]
    pixels: PixelInputs | None
    stop_ids: frozenset[int]
    positions: torch.Tensor
    rope_delta: int


@dataclass(frozen=True)
class PromptRules:
    """What a prompt is checked and laid out against: the model's vocabulary and context, and its EOS ids."""

    model: PreTrainedModel
    processor: VLProcessor
    vocab_size: int
    max_context_len: int
    eos_ids: frozenset[int]

    def prepare(self, request: GenerateRequest) -> Prompt:
        """Check the ids, decode the images, expand each single pad to the image's token count and find
        the prompt's mRoPE positions with the model's `get_rope_index`."""
        ids = request.engine_ids
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise EngineRequestError(f"token ids out of range [0, {self.vocab_size}): {bad[:5]}")
        pads = ids.count(self.processor.ids.image_pad)
        if pads != len(request.images):
            raise EngineRequestError(
                f"engine_ids hold {pads} <|image_pad|> tokens for {len(request.images)} images; "
                "send exactly one pad per image (single-pad engine_ids)"
            )
        pixels = None
        input_ids = list(ids)
        if request.images:
            try:
                pixels = self.processor.pixel_inputs(request.images)
            except (ImageError, OSError, ValueError) as exc:
                raise EngineRequestError(f"bad image: {exc}") from exc
            input_ids = self.processor.expand_image_pads(ids, pixels.image_grid_thw.tolist())
        if len(input_ids) >= self.max_context_len:
            raise EngineRequestError(
                f"prompt of {len(input_ids)} tokens does not fit the context of {self.max_context_len}"
            )
        params = request.sampling
        stop_ids = frozenset() if params.ignore_eos else self.eos_ids | frozenset(params.stop_token_ids or ())
        row = torch.tensor(input_ids)[None]
        positions, delta = self.model.model.get_rope_index(
            row,
            mm_token_type_ids=(row == self.processor.ids.image_pad).int(),
            image_grid_thw=pixels.image_grid_thw if pixels is not None else None,
        )
        return Prompt(input_ids, pixels, stop_ids, positions, int(delta))
