"""Trainer (live module) parameter names and the checkpoint names engines load.

transformers 5 names Qwen2.5-VL's modules `model.language_model.*` / `model.visual.*`, while its
checkpoints (and SGLang's loader) say `model.*` / `visual.*`; Qwen3-VL checkpoints already use the live
names. `checkpoint_name` and `live_name` map between the two; a tied `lm_head.weight` is left out, as in
the checkpoints.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from transformers import PretrainedConfig

__all__ = [
    "CHECKPOINT_PREFIXES",
    "TIED_HEAD",
    "checkpoint_name",
    "is_tied",
    "live_name",
    "to_checkpoint_state",
]

# (live prefix, checkpoint prefix) per `config.model_type`; the first matching prefix wins.
CHECKPOINT_PREFIXES: dict[str, tuple[tuple[str, str], ...]] = {
    "qwen2_5_vl": (("model.language_model.", "model."), ("model.visual.", "visual.")),
    "qwen3_vl": (),
}
TIED_HEAD = "lm_head.weight"


def _prefixes(model_type: str) -> tuple[tuple[str, str], ...]:
    """The prefix renames of one architecture; an unknown one is an error naming the known ones."""
    try:
        return CHECKPOINT_PREFIXES[model_type]
    except KeyError:
        known = ", ".join(sorted(CHECKPOINT_PREFIXES))
        raise ValueError(
            f"no checkpoint naming known for model_type {model_type!r} (known: {known})"
        ) from None


def checkpoint_name(name: str, model_type: str) -> str:
    """The checkpoint (and SGLang) name of a live parameter name."""
    for live, saved in _prefixes(model_type):
        if name.startswith(live):
            return saved + name[len(live) :]
    return name


def live_name(name: str, model_type: str) -> str:
    """The live module name of a checkpoint parameter name: the inverse of `checkpoint_name`."""
    for live, saved in _prefixes(model_type):
        if name.startswith(saved) and not name.startswith(live):
            return live + name[len(saved) :]
    return name


def is_tied(name: str, config: PretrainedConfig) -> bool:
    """Whether `name` is the `lm_head` tied to the input embeddings: checkpoints and pushes leave it out."""
    return name == TIED_HEAD and bool(getattr(config, "tie_word_embeddings", False))


def to_checkpoint_state(
    state_dict: Mapping[str, torch.Tensor], config: PretrainedConfig, dtype: torch.dtype | None = None
) -> dict[str, torch.Tensor]:
    """The state dict under checkpoint names, cast to `dtype` if given; a tied `lm_head` is dropped."""
    return {
        checkpoint_name(name, config.model_type): tensor if dtype is None else tensor.to(dtype)
        for name, tensor in state_dict.items()
        if not is_tied(name, config)
    }
