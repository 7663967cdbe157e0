"""A checkpoint's transformers processor (a `ProcessorMixin`, what TRL's trainers take for a VLM), with or
without torchvision.

transformers builds a Qwen-VL processor with a video processor, which needs torchvision. The CPU
install (`make install`) has none, since vistarl's own processor (`trainer/rollout/processor.py`) needs
none; there a Qwen3-VL checkpoint gets its processor class without the video part: images and text,
all that an env's episodes hold. examples/trl_grpo.py and tests/test_trl.py load the tiny checkpoint so.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

from transformers import AutoProcessor, ProcessorMixin
from transformers.models.qwen3_vl import Qwen3VLProcessor

__all__ = ["StillImageQwen3VLProcessor", "load_processor"]


class StillImageQwen3VLProcessor(Qwen3VLProcessor):
    """Qwen3-VL's processor without its video processor, so that it loads without torchvision."""

    def __init__(
        self,
        image_processor: Any = None,
        tokenizer: Any = None,
        chat_template: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(image_processor, tokenizer, None, chat_template=chat_template, **kwargs)


def load_processor(checkpoint: str | Path) -> ProcessorMixin:
    """The checkpoint's processor: transformers' own where torchvision is installed (or the checkpoint is
    not a local Qwen3-VL), else `StillImageQwen3VLProcessor` with the PIL image backend."""
    config = Path(checkpoint) / "config.json"
    local_qwen3_vl = config.is_file() and json.loads(config.read_text()).get("model_type") == "qwen3_vl"
    if importlib.util.find_spec("torchvision") is not None or not local_qwen3_vl:
        processor: ProcessorMixin = AutoProcessor.from_pretrained(checkpoint)
        return processor
    return StillImageQwen3VLProcessor.from_pretrained(checkpoint, backend="pil")
