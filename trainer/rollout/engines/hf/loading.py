"""Loading the HF engine's model, its EOS ids, and the choice of its decoder."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForImageTextToText, PreTrainedModel

from vistarl.trainer.rollout.engines.hf.fused import Fusions
from vistarl.trainer.rollout.engines.hf.static_decoder import StaticDecoder
from vistarl.trainer.rollout.processor import VLProcessor

DEFAULT_STATIC_CACHE_LEN = 4096


def load_model(path: str | Path, device: str, dtype: torch.dtype) -> PreTrainedModel:
    """A Qwen-VL checkpoint through the same `from_pretrained` path a downloaded one uses (local only)."""
    model: PreTrainedModel = AutoModelForImageTextToText.from_pretrained(
        str(path), dtype=dtype, local_files_only=True
    )
    return model.to(device).eval()


def eos_ids(model: PreTrainedModel, processor: VLProcessor) -> frozenset[int]:
    """`<|im_end|>` plus the model's generation-config EOS ids."""
    configured = getattr(model.generation_config, "eos_token_id", None) if model.generation_config else None
    if configured is None:
        configured = []
    elif isinstance(configured, int):
        configured = [configured]
    return frozenset({processor.ids.im_end, *configured})


def static_decoder(
    model: PreTrainedModel, fusions: Fusions, slots: int, cuda_graphs: bool, cache_len: int | None
) -> StaticDecoder | None:
    """The engine's static-cache decoder: always on a GPU (`cache_len` positions a row, by default the
    context, at most `DEFAULT_STATIC_CACHE_LEN`), its steps in CUDA graphs when `cuda_graphs`; on the CPU
    when a cache length is given; else None, for HF's eager decode."""
    if next(model.parameters()).device.type == "cuda":
        context = int(model.config.get_text_config().max_position_embeddings)
        length = cache_len or min(context, DEFAULT_STATIC_CACHE_LEN)
        return StaticDecoder(model, fusions, slots=slots, cache_len=length, cuda_graphs=cuda_graphs)
    if cache_len is not None:
        return StaticDecoder(model, fusions, slots=slots, cache_len=cache_len, cuda_graphs=False)
    return None
