"""The tiny checkpoint loads through the real `from_pretrained` path with Qwen's real token ids."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch
from PIL import Image
from transformers import AutoImageProcessor, AutoModelForImageTextToText, AutoTokenizer

from vistarl.devtools.model_shapes import SHAPES, arch_for, qwen_vl_config
from vistarl.devtools.servers import vistarl_cmd
from vistarl.devtools.tiny_checkpoint import ARCHS

QWEN_SPECIAL_IDS = {
    "<|endoftext|>": 151643,
    "<|im_start|>": 151644,
    "<|im_end|>": 151645,
    "<|vision_start|>": 151652,
    "<|vision_end|>": 151653,
    "<|image_pad|>": 151655,
    "<|video_pad|>": 151656,
    "<tool_call>": 151657,
    "</tool_call>": 151658,
}


@pytest.mark.parametrize("arch", ARCHS)
def test_tokenizer_has_qwen_ids(tiny_checkpoints: dict[str, Path], arch: str) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_checkpoints[arch])
    for text, token_id in QWEN_SPECIAL_IDS.items():
        assert tok.convert_tokens_to_ids(text) == token_id
        assert tok.encode(text, add_special_tokens=False) == [token_id]
    # Ids of ordinary text under Qwen's BPE ranks: "Hello" and " world" are single tokens.
    assert tok.encode("Hello world", add_special_tokens=False) == [9707, 1879]
    assert tok.eos_token_id == 151645


def test_chat_templates_render_qwen_format(tiny_qwen25: Path, tiny_qwen3: Path) -> None:
    user = {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]}
    r25 = AutoTokenizer.from_pretrained(tiny_qwen25).apply_chat_template(
        [user], tokenize=False, add_generation_prompt=True
    )
    assert r25 == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>hi<|im_end|>\n<|im_start|>assistant\n"
    )
    r3 = AutoTokenizer.from_pretrained(tiny_qwen3).apply_chat_template(
        [user, {"role": "assistant", "content": "ok"}], tokenize=False
    )
    assert r3 == (
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>hi<|im_end|>\n"
        "<|im_start|>assistant\nok<|im_end|>\n"
    )


@pytest.mark.parametrize("arch", ARCHS)
def test_model_generates_from_pretrained(tiny_checkpoints: dict[str, Path], arch: str) -> None:
    path = tiny_checkpoints[arch]
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32)
    processor = AutoImageProcessor.from_pretrained(path)
    assert model.config.image_token_id == 151655
    pixels = processor(images=[Image.new("RGB", (64, 64), (10, 200, 30))], return_tensors="pt")
    n_pads = int(pixels["image_grid_thw"].prod()) // 4
    ids = torch.tensor([[151644, 872, 198, 151652] + [151655] * n_pads + [151653, 151645, 198]])
    out = model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        pixel_values=pixels["pixel_values"],
        image_grid_thw=pixels["image_grid_thw"],
        max_new_tokens=4,
        do_sample=False,
    )
    assert out.shape == (1, ids.shape[1] + 4)


def test_cli_writes_checkpoint(tmp_path: Path) -> None:
    subprocess.run(vistarl_cmd("model", "tiny", "--out", str(tmp_path / "m")), check=True)  # as documented
    for name in ("config.json", "model.safetensors", "tokenizer.json", "preprocessor_config.json"):
        assert (tmp_path / "m" / name).exists()
    for option, value in (("--arch", "llama"), ("--shape", "huge")):
        bad = subprocess.run(
            vistarl_cmd("model", "tiny", "--out", str(tmp_path / "x"), option, value),
            capture_output=True,
            text=True,
        )
        assert bad.returncode != 0 and "choose one of" in bad.stderr and not (tmp_path / "x").exists()
    mismatched = subprocess.run(
        vistarl_cmd(
            "model", "tiny", "--out", str(tmp_path / "y"), "--shape", "qwen3_vl_2b", "--arch", "qwen2_5_vl"
        ),
        capture_output=True,
        text=True,
    )
    assert mismatched.returncode != 0 and "qwen3_vl" in mismatched.stderr and not (tmp_path / "y").exists()


def test_a_released_shape_is_written_in_its_own_architecture() -> None:
    """`--shape qwen3_vl_2b` means Qwen3-VL (deepstack, interleaved mRoPE), whatever the default arch."""
    assert arch_for("qwen3_vl_2b") == "qwen3_vl" == arch_for("qwen3_vl_2b", "qwen3_vl")
    assert arch_for("qwen2_5_vl_3b") == "qwen2_5_vl"
    assert arch_for("tiny") == "qwen2_5_vl" and arch_for("tiny", "qwen3_vl") == "qwen3_vl"
    with pytest.raises(ValueError, match="qwen3_vl"):
        arch_for("qwen3_vl_2b", "qwen2_5_vl")
    config = qwen_vl_config(arch_for("qwen3_vl_2b"), SHAPES["qwen3_vl_2b"])
    assert config.model_type == "qwen3_vl" and config.text_config.num_key_value_heads == 8
