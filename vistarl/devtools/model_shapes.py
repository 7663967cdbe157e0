"""Qwen-VL configs by size: one `ModelShape` of widths and depths, everything else as the real
architectures' `config.json` has it (rope, special tokens, patching, which vision blocks attend fully).

`tiny` is the CPU test model and `make demo`'s; `small` and `medium` are larger ones trained from scratch
(`medium` on a GPU, docs/results.md); `qwen2_5_vl_3b` is the shape of Qwen/Qwen2.5-VL-3B-Instruct and
`qwen3_vl_2b` that of Qwen/Qwen3-VL-2B-Instruct (deepstack mergers after vision blocks 5, 11 and 17),
which the training-step and weight-sync benchmarks measure. Weights are never part of a shape: they are
random.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, cast

if TYPE_CHECKING:
    from transformers import PretrainedConfig

__all__ = ["ARCHS", "REAL_SHAPES", "SHAPES", "Arch", "ModelShape", "arch_for", "qwen_vl_config"]

Arch = Literal["qwen2_5_vl", "qwen3_vl"]
ARCHS: tuple[Arch, ...] = ("qwen2_5_vl", "qwen3_vl")

VOCAB_SIZE = 151936
SPECIAL_TOKENS = {"image_token_id": 151655, "video_token_id": 151656, "vision_start_token_id": 151652}


@dataclass(frozen=True)
class ModelShape:
    """Widths and depths of the text model and the vision tower."""

    hidden_size: int
    intermediate_size: int
    layers: int
    heads: int
    kv_heads: int
    vision_depth: int
    vision_hidden_size: int
    vision_intermediate_size: int
    vision_heads: int
    max_position_embeddings: int = 32768
    mrope: tuple[int, int, int] | None = None
    vision_positions: int = 576

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.heads

    @property
    def mrope_section(self) -> list[int]:
        """The t/h/w split of the rotary half-dimension: `mrope` if given, else Qwen2.5-VL's 1/4, 3/8, 3/8."""
        if self.mrope is not None:
            return list(self.mrope)
        half = self.head_dim // 2
        return [half // 4, half * 3 // 8, half * 3 // 8]


SHAPES: dict[str, ModelShape] = {
    "tiny": ModelShape(128, 256, 2, 4, 2, 2, 64, 128, 2),
    "small": ModelShape(256, 768, 4, 4, 2, 2, 128, 256, 2),
    "medium": ModelShape(512, 1536, 8, 8, 4, 4, 256, 512, 4),
    "qwen2_5_vl_3b": ModelShape(2048, 11008, 36, 16, 2, 32, 1280, 3420, 16, 128000),
    "qwen3_vl_2b": ModelShape(2048, 6144, 28, 16, 8, 24, 1024, 4096, 16, 262144, (24, 20, 20), 2304),
}

REAL_SHAPES: dict[str, Arch] = {"qwen2_5_vl_3b": "qwen2_5_vl", "qwen3_vl_2b": "qwen3_vl"}
"""The shapes of released models, with their architecture: what the GPU benchmarks measure."""


def arch_for(shape: str, arch: str | None = None) -> Arch:
    """The architecture a checkpoint of `shape` is written in: a released shape's own (an `arch` that
    differs is refused), else `arch`, else Qwen2.5-VL."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; choose one of {', '.join(SHAPES)}")
    if arch is not None and arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}; choose one of {', '.join(ARCHS)}")
    implied = REAL_SHAPES.get(shape)
    if implied is not None and arch not in (None, implied):
        raise ValueError(f"shape {shape} is a {implied} model's; leave the arch out or give {implied}")
    return implied or cast(Arch, arch or "qwen2_5_vl")


def qwen_vl_config(arch: Arch, shape: ModelShape) -> PretrainedConfig:
    """The config of architecture `arch` at `shape`, with tied word embeddings."""
    from transformers import Qwen2_5_VLConfig, Qwen3VLConfig  # here: the shapes alone import in milliseconds

    text: dict[str, object] = {
        "vocab_size": VOCAB_SIZE,
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "max_position_embeddings": shape.max_position_embeddings,
        "rms_norm_eps": 1e-6,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "pad_token_id": 151643,
    }
    vision: dict[str, object] = {
        "depth": shape.vision_depth,
        "hidden_size": shape.vision_hidden_size,
        "intermediate_size": shape.vision_intermediate_size,
        "num_heads": shape.vision_heads,
        "out_hidden_size": shape.hidden_size,
    }
    depth = shape.vision_depth
    if arch == "qwen2_5_vl":
        text["rope_parameters"] = {
            "rope_type": "default",
            "rope_theta": 1e6,
            "mrope_section": shape.mrope_section,
        }
        full_attention = [i for i in range(depth) if i % 8 == 7 or i == depth - 1]
        vision |= {"window_size": 112, "fullatt_block_indexes": full_attention, "tokens_per_second": 2}
        return Qwen2_5_VLConfig(
            text_config=text, vision_config=vision, tie_word_embeddings=True, **SPECIAL_TOKENS
        )
    text["rope_parameters"] = {
        "rope_type": "default",
        "rope_theta": 5e6,
        "mrope_section": shape.mrope_section,
        "mrope_interleaved": True,
    }
    deepstack = sorted({max(0, depth * quarter // 4 - 1) for quarter in (1, 2, 3)})
    vision |= {"num_position_embeddings": shape.vision_positions, "deepstack_visual_indexes": deepstack}
    return Qwen3VLConfig(
        text_config=text,
        vision_config=vision,
        tie_word_embeddings=True,
        vision_end_token_id=151653,
        **SPECIAL_TOKENS,
    )
