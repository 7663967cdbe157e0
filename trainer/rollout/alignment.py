"""Check that the engine and the trainer tokenize the same way, before any rollout starts.

Token-exact trajectories are only meaningful if the engine's token ids mean the same to the trainer.
The check compares the vocabulary size, the Qwen special-token ids and the ids of a probe render (a
multi-turn conversation with images, through each side's chat template), and raises
`TokenizerMismatchError` listing every difference. The engine side loads from the path SGLang's
`/model_info` reports (`tokenizer_path`, else `model_path`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer, PreTrainedTokenizerBase

__all__ = [
    "QWEN_SPECIAL_TOKENS",
    "TokenizerMismatchError",
    "check_engine_alignment",
    "check_tokenizer_alignment",
    "load_engine_tokenizer",
    "tokenizer_differences",
]

QWEN_SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
)

_IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,"}}
_CONVERSATION: list[dict[str, Any]] = [
    {"role": "user", "content": [_IMAGE, {"type": "text", "text": "Turn 1: push the box (3, 4) → 目标."}]},
    {"role": "assistant", "content": "The box is left of me.\n<answer>Left</answer>"},
    {"role": "user", "content": [_IMAGE, _IMAGE, {"type": "text", "text": "Reward 0.50; 2 steps left  ok?"}]},
]
# Rendered with the generation prompt, with and without a system prompt (templates may add a default one).
PROBES: tuple[list[dict[str, Any]], ...] = (
    [{"role": "system", "content": "You solve Sokoban. Answer with <answer>Left</answer>."}, *_CONVERSATION],
    _CONVERSATION,
)
_CONTEXT = 4  # tokens shown either side of the first differing probe token


class TokenizerMismatchError(RuntimeError):
    """The engine's and the trainer's tokenizers disagree; the message lists every difference."""


def check_tokenizer_alignment(engine: PreTrainedTokenizerBase, trainer: PreTrainedTokenizerBase) -> None:
    """Raise `TokenizerMismatchError` unless the tokenizers agree on vocabulary, special ids and probe."""
    differences = tokenizer_differences(engine, trainer)
    if differences:
        lines = "\n".join(f"  - {line}" for line in differences)
        raise TokenizerMismatchError(f"the engine and trainer tokenizers differ:\n{lines}")


def tokenizer_differences(engine: PreTrainedTokenizerBase, trainer: PreTrainedTokenizerBase) -> list[str]:
    """Every way the two tokenizers differ, one line each (empty when they agree)."""
    out: list[str] = []
    if len(engine) != len(trainer):
        out.append(f"vocabulary size: engine {len(engine)}, trainer {len(trainer)}")
    for token in QWEN_SPECIAL_TOKENS:
        engine_id, trainer_id = engine.convert_tokens_to_ids(token), trainer.convert_tokens_to_ids(token)
        if engine_id != trainer_id:
            out.append(f"id of {token}: engine {engine_id}, trainer {trainer_id}")
    engine_text, trainer_text = _probe_render(engine, "engine", out), _probe_render(trainer, "trainer", out)
    if engine_text is None or trainer_text is None:
        return out
    if engine_text != trainer_text:
        at = _first_difference(engine_text, trainer_text)
        window = slice(max(0, at - 20), at + 40)
        out.append(
            f"chat template render of the probe differs from character {at}: "
            f"engine {engine_text[window]!r}, trainer {trainer_text[window]!r}"
        )
    engine_ids = engine.encode(engine_text, add_special_tokens=False)
    trainer_ids = trainer.encode(trainer_text, add_special_tokens=False)
    if engine_ids != trainer_ids:
        at = _first_difference(engine_ids, trainer_ids)
        window = slice(max(0, at - _CONTEXT), at + _CONTEXT)
        out.append(
            f"probe ids differ from token {at} "
            f"(engine {len(engine_ids)} tokens, trainer {len(trainer_ids)}): "
            f"engine {_show(engine, engine_ids[window])}, trainer {_show(trainer, trainer_ids[window])}"
        )
    return out


def load_engine_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """The engine's tokenizer from the checkpoint directory it serves (it must be readable here too)."""
    try:
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise OSError(f"cannot load the engine's tokenizer from {str(path)!r}: {exc}") from exc


def check_engine_alignment(engine_path: str | Path, trainer: PreTrainedTokenizerBase) -> None:
    """Load the engine's tokenizer from `engine_path` and check it against the trainer's."""
    check_tokenizer_alignment(load_engine_tokenizer(engine_path), trainer)


def _probe_render(tokenizer: PreTrainedTokenizerBase, side: str, out: list[str]) -> str | None:
    """The probe conversations through `tokenizer`'s chat template; a failure is recorded in `out`."""
    try:
        return "".join(
            str(tokenizer.apply_chat_template(probe, tokenize=False, add_generation_prompt=True))
            for probe in PROBES
        )
    except Exception as exc:  # the template is user content: any error in it is a difference to report
        out.append(f"the {side} chat template cannot render the probe: {type(exc).__name__}: {exc}")
        return None


def _first_difference(a: Sequence[Any], b: Sequence[Any]) -> int:
    """The first index where `a` and `b` differ (the shorter length when one is a prefix of the other)."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def _show(tokenizer: PreTrainedTokenizerBase, ids: list[int]) -> str:
    """Ids with their token strings, for an error message."""
    return str(list(zip(ids, tokenizer.convert_ids_to_tokens(ids), strict=True)))
