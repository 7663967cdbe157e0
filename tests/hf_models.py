"""The tiny checkpoints loaded as the HF engine's tests take them: fp32, in eval mode, with the processor."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForImageTextToText, PreTrainedModel

from vistarl.trainer.rollout.processor import VLProcessor

Loaded = tuple[PreTrainedModel, VLProcessor]


def load(path: Path) -> Loaded:
    """The checkpoint at `path` in fp32 eval mode, and its processor."""
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
    return model, VLProcessor.from_pretrained(path)
