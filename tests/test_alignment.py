"""The engine/trainer tokenizer check passes identical tokenizers and names every difference otherwise."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from vistarl.trainer.rollout.alignment import (
    TokenizerMismatchError,
    check_engine_alignment,
    check_tokenizer_alignment,
    load_engine_tokenizer,
)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


@pytest.fixture(scope="module")
def trainer_tokenizer(tiny_qwen25: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(tiny_qwen25)


def copy_tokenizer(src: Path, dst: Path) -> Path:
    """A checkpoint directory holding only `src`'s tokenizer files (what an engine would load)."""
    dst.mkdir()
    for name in TOKENIZER_FILES:
        shutil.copy(src / name, dst / name)
    return dst


def test_identical_tokenizers_pass(tiny_qwen25: Path, trainer_tokenizer: PreTrainedTokenizerBase) -> None:
    check_engine_alignment(tiny_qwen25, trainer_tokenizer)


def test_shifted_special_id_fails(
    tiny_qwen25: Path, tmp_path: Path, trainer_tokenizer: PreTrainedTokenizerBase
) -> None:
    engine_dir = copy_tokenizer(tiny_qwen25, tmp_path / "engine")
    spec = json.loads((engine_dir / "tokenizer.json").read_text())
    added = spec["added_tokens"]  # ids follow list order: swapping two entries swaps their ids
    assert [added[2]["content"], added[3]["content"]] == ["<|im_end|>", "<|object_ref_start|>"]
    added[2]["content"], added[3]["content"] = added[3]["content"], added[2]["content"]
    (engine_dir / "tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(TokenizerMismatchError) as err:
        check_engine_alignment(engine_dir, trainer_tokenizer)
    message = str(err.value)
    assert "id of <|im_end|>: engine 151646, trainer 151645" in message
    assert "probe ids differ" in message and "(151646, '<|im_end|>')" in message
    assert "vocabulary size" not in message


def test_different_template_fails(
    tiny_qwen25: Path, tiny_qwen3: Path, tmp_path: Path, trainer_tokenizer: PreTrainedTokenizerBase
) -> None:
    engine_dir = copy_tokenizer(tiny_qwen25, tmp_path / "engine")
    shutil.copy(tiny_qwen3 / "chat_template.jinja", engine_dir / "chat_template.jinja")
    with pytest.raises(TokenizerMismatchError) as err:
        check_engine_alignment(engine_dir, trainer_tokenizer)
    message = str(err.value)
    assert "chat template render of the probe differs" in message
    assert "You are a helpful assistant." in message  # Qwen2.5-VL's default system block, missing on one side
    assert "id of" not in message and "vocabulary size" not in message


def test_missing_template_fails(
    tiny_qwen25: Path, tmp_path: Path, trainer_tokenizer: PreTrainedTokenizerBase
) -> None:
    engine_dir = copy_tokenizer(tiny_qwen25, tmp_path / "engine")
    (engine_dir / "chat_template.jinja").unlink()
    with pytest.raises(TokenizerMismatchError, match="the engine chat template cannot render the probe"):
        check_engine_alignment(engine_dir, trainer_tokenizer)


def test_different_vocab_size_fails(trainer_tokenizer: PreTrainedTokenizerBase) -> None:
    engine = copy.deepcopy(trainer_tokenizer)
    engine.add_tokens(["<|extra_0|>"])
    with pytest.raises(TokenizerMismatchError, match=r"vocabulary size: engine 151670, trainer 151669"):
        check_tokenizer_alignment(engine, trainer_tokenizer)


def test_unreadable_engine_path_fails_clearly(tmp_path: Path) -> None:
    with pytest.raises(OSError, match="cannot load the engine's tokenizer from"):
        load_engine_tokenizer(tmp_path / "missing")
