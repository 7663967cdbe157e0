"""Packed-row attention for the GPU trainer: one FlashAttention call per layer over every sequence of a row.

HF's SDPA path cannot run a packed row on the flash kernel: it turns the row's text positions into a
dense `[T, T]` block-diagonal mask, and Qwen-VL's vision blocks call SDPA once per attention window.
`use_attention(model, VARLEN_ATTENTION)` switches an HF Qwen-VL model to torch's `varlen_attn`
(FlashAttention-2 kernels shipped with torch; CUDA, bf16/fp16 only, so float32 inputs under autocast
are cast to its dtype), registered with transformers'
attention interface. The name holds "flash", so vision blocks take their `cu_seqlens` path. Decoder
layers get no mask; their sequence bounds come with the packed batch (`SequenceBounds`, found on the
host when it was packed, passed to the backbone by `packed_attention_kwargs`), or else are found per
layer where the row's text positions restart at 0.

Where the kernel cannot run (the CPU, float32), `SEQUENCE_SDPA_ATTENTION` computes the same packed row with
SDPA once per sequence, from the same bounds: the HF engine's prompt pass runs on one or the other
(`attention_for`), and a dense block mask over a row of many prompts would be quadratic in the row. In that
pass a prompt whose first tokens came from the engine's prefix cache has fewer queries than keys: the keys'
bounds come apart from the queries' (`packed_attention_kwargs`' `keys`), and each query attends to the keys
up to its own position, the causal mask aligned at the sequence's end (FlashAttention's alignment).

The HF engine's decode steps run `GROUPED_DECODE_ATTENTION`: one query token a row against its cache slot,
the query heads that share a kv head passed to SDPA as that head's queries, so each cached key and value is
read once per step. HF's own SDPA path copies every kv head once per query head (`repeat_kv`) whenever a mask
is given, which at batch 128 moved gigabytes a layer (docs/benchmarks.md, "The HF engine's decode step").
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import weakref
from collections.abc import Iterator
from typing import Any, NamedTuple, cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.varlen import varlen_attn
from transformers import AttentionInterface, PretrainedConfig, PreTrainedModel

VARLEN_ATTENTION = "flash_varlen_torch"
SEQUENCE_SDPA_ATTENTION = "sequence_sdpa"
GROUPED_DECODE_ATTENTION = "grouped_decode_sdpa"
SDPA_ATTENTION = "sdpa"

_GQA: dict[str, Any] = (
    {"enable_gqa": True} if "enable_gqa" in inspect.signature(varlen_attn).parameters else {}
)
"""Grouped kv heads go to the kernel as they are (FlashAttention shares each among its query heads): torch
2.13 asks for the flag, torch 2.11 has none and takes them without it."""


class SequenceBounds(NamedTuple):
    """The sequences of a packed row: `cu_seqlens` (int32 `[S + 1]`, on the GPU with the row) and the
    longest length, a host int, so no layer has to ask the GPU for it."""

    cu_seqlens: torch.Tensor
    longest: int


def sequence_bounds(
    position_ids: torch.Tensor | None, batch: int, length: int, device: torch.device
) -> tuple[torch.Tensor, int]:
    """`cu_seqlens` (int32) and the longest sequence of `batch` rows of `length` tokens.

    Sequences start where a text position is 0; without positions, each row is one sequence.
    """
    if position_ids is None:
        return torch.arange(0, (batch + 1) * length, length, dtype=torch.int32, device=device), length
    flat = position_ids.reshape(-1)
    starts = (flat == 0).nonzero().flatten()
    if starts.numel() == 0 or int(starts[0]) != 0:
        raise ValueError("packed text positions must restart at 0 at the start of every sequence")
    cu_seqlens = torch.cat([starts, starts.new_tensor([flat.numel()])]).int()
    return cu_seqlens, int(cu_seqlens.diff().max())


def packed_attention_kwargs(
    config: PretrainedConfig, bounds: SequenceBounds, keys: SequenceBounds | None = None
) -> dict[str, object]:
    """Backbone kwargs that give every decoder layer the packed row's sequence bounds (`{}` unless a packed
    implementation): the queries', and the keys' where they differ (each sequence's keys end with its
    queries' tokens, after tokens whose keys and values were cached)."""
    if config._attn_implementation not in _PACKED:
        return {}
    kwargs: dict[str, object] = {"packed_cu_seqlens": bounds.cu_seqlens, "packed_max_seqlen": bounds.longest}
    if keys is not None:
        kwargs |= {"packed_cu_seqlens_k": keys.cu_seqlens, "packed_max_seqlen_k": keys.longest}
    return kwargs


def varlen_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    is_causal: bool | None = None,
    position_ids: torch.Tensor | None = None,
    cu_seq_lens_q: torch.Tensor | None = None,
    max_length_q: int | None = None,
    packed_cu_seqlens: torch.Tensor | None = None,
    packed_max_seqlen: int | None = None,
    packed_cu_seqlens_k: torch.Tensor | None = None,
    packed_max_seqlen_k: int | None = None,
    **_: object,
) -> tuple[torch.Tensor, None]:
    """HF attention function: `[B, H, T, D]` q/k/v (k/v may have fewer heads, and in a packed row with
    `packed_*_k` bounds more tokens) to `[B, T, H, D]`.

    Vision blocks pass `cu_seq_lens_q`; decoder layers get `packed_*` from `packed_attention_kwargs`,
    or else their text `position_ids`.
    """
    if attention_mask is not None or dropout or sliding_window is not None:
        raise ValueError(f"{VARLEN_ATTENTION} takes packed rows only: no mask, dropout or sliding window")
    batch, heads, length, dim = query.shape
    device = query.device.type
    if query.dtype == torch.float32 and torch.is_autocast_enabled(device):
        # fp32 q/k after the rotary tables under autocast: the kernel takes the autocast dtype
        query, key, value = (x.to(torch.get_autocast_dtype(device)) for x in (query, key, value))
    if cu_seq_lens_q is None or max_length_q is None:
        if packed_cu_seqlens is not None and packed_max_seqlen is not None:
            cu_seq_lens_q, max_length_q = packed_cu_seqlens, packed_max_seqlen
        else:
            cu_seq_lens_q, max_length_q = sequence_bounds(position_ids, batch, length, query.device)
    cu_seqlens_k, max_length_k = cu_seq_lens_q, max_length_q
    if packed_cu_seqlens_k is not None and packed_max_seqlen_k is not None:
        cu_seqlens_k, max_length_k = packed_cu_seqlens_k, packed_max_seqlen_k
    q, k, v = (x.transpose(1, 2).reshape(-1, x.shape[1], dim) for x in (query, key, value))
    causal = bool(getattr(module, "is_causal", False)) if is_causal is None else is_causal
    out = varlen_attn(  # a plain tensor: no auxiliary outputs are requested; causal aligned at the end
        q,
        k,
        v,
        cu_seq_lens_q.int(),
        cu_seqlens_k.int(),
        max_length_q,
        max_length_k,
        scale=scaling,
        window_size=(-1, 0) if causal else (-1, -1),
        **_GQA,
    )
    return cast(torch.Tensor, out).view(batch, length, heads, dim), None


def sequence_sdpa_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    is_causal: bool | None = None,
    packed_cu_seqlens: torch.Tensor | None = None,
    packed_cu_seqlens_k: torch.Tensor | None = None,
    **options: object,
) -> tuple[torch.Tensor, None]:
    """HF attention function: what `varlen_attention` computes for a packed row with `packed_*` bounds, as
    SDPA once per sequence, on any device and dtype. `[1, H, T, D]` q/k/v to `[1, T, H, D]`."""
    if attention_mask is not None or packed_cu_seqlens is None or _unsupported(options):
        raise ValueError(f"{SEQUENCE_SDPA_ATTENTION} takes packed rows with their bounds only, and no mask")
    causal = bool(getattr(module, "is_causal", False)) if is_causal is None else is_causal
    grouped = key.shape[1] != query.shape[1]
    queries = list(itertools.pairwise(packed_cu_seqlens.tolist()))
    keys = queries if packed_cu_seqlens_k is None else list(itertools.pairwise(packed_cu_seqlens_k.tolist()))
    parts = []
    for (q_start, q_end), (k_start, k_end) in zip(queries, keys, strict=True):
        queried, known = q_end - q_start, k_end - k_start
        ending = causal and queried != known  # fewer queries than keys: the causal mask ends with the keys
        parts.append(
            F.scaled_dot_product_attention(
                query[:, :, q_start:q_end],
                key[:, :, k_start:k_end],
                value[:, :, k_start:k_end],
                attn_mask=_causal_at_end(queried, known, query.device) if ending else None,
                is_causal=causal and not ending,
                scale=scaling,
                enable_gqa=grouped,
            )
        )
    return torch.cat(parts, dim=2).transpose(1, 2), None


def _causal_at_end(queries: int, keys: int, device: torch.device) -> torch.Tensor:
    """The causal mask of the last `queries` of `keys` tokens: query i sees the keys up to
    `keys - queries + i`."""
    return torch.ones(queries, keys, dtype=torch.bool, device=device).tril(keys - queries)


def grouped_decode_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **options: object,
) -> tuple[torch.Tensor, None]:
    """HF attention function for one decode token a row: `[B, H, 1, D]` queries against `[B, Hkv, L, D]`
    keys and values under `attention_mask` `[B, 1, 1, L]` (True where a row attends), to `[B, 1, H, D]`.

    Query head h uses kv head h // (H / Hkv), as `repeat_kv` pairs them, so the `[B, Hkv, H / Hkv, D]` view
    of the queries is SDPA's query length per kv head: the same sums, without the copies."""
    batch, heads, length, dim = query.shape
    if length != 1 or _unsupported(options):
        raise ValueError(f"{GROUPED_DECODE_ATTENTION} takes one query token a row, no dropout or window")
    kv_heads = key.shape[1]
    grouped = query.reshape(batch, kv_heads, heads // kv_heads, dim)
    scaling = cast(float | None, options.get("scaling"))
    out = F.scaled_dot_product_attention(grouped, key, value, attn_mask=attention_mask, scale=scaling)
    return out.reshape(batch, 1, heads, dim), None


def _unsupported(options: dict[str, object]) -> bool:
    """Whether HF asked for dropout or a sliding window, which the per-sequence and decode paths never run."""
    return bool(options.get("dropout")) or options.get("sliding_window") is not None


_PACKED = {VARLEN_ATTENTION: varlen_attention, SEQUENCE_SDPA_ATTENTION: sequence_sdpa_attention}
"""The implementations that read a packed row's bounds, registered with transformers when first used."""

_DECODE = {GROUPED_DECODE_ATTENTION: grouped_decode_attention}
"""The decode step's implementation, registered with transformers when first used."""


def use_attention(model: nn.Module, implementation: str) -> None:
    """Run every HF (sub)model inside `model` with `implementation` (`VARLEN_ATTENTION`,
    `SEQUENCE_SDPA_ATTENTION`, `GROUPED_DECODE_ATTENTION` or `SDPA_ATTENTION`).

    Sets the configs directly: HF's `set_attn_implementation` would look for a flash-attn package.
    """
    function = _PACKED.get(implementation) or _DECODE.get(implementation)
    if function is not None:
        AttentionInterface.register(implementation, function)
    for config in _configs(model):
        config._attn_implementation = implementation


@contextlib.contextmanager
def attention_for(model: nn.Module, implementation: str) -> Iterator[None]:
    """`use_attention(model, implementation)` for the body of the `with`, the previous ones restored after:
    for a pass that differs from the model's other passes (the HF engine's packed prompt pass)."""
    configs = _configs(model)
    previous = [config._attn_implementation for config in configs]
    use_attention(model, implementation)
    try:
        yield
    finally:
        for config, name in zip(configs, previous, strict=True):
            config._attn_implementation = name


_CONFIGS: weakref.WeakKeyDictionary[nn.Module, list[PretrainedConfig]] = weakref.WeakKeyDictionary()


def _configs(model: nn.Module) -> list[PretrainedConfig]:
    """The configs of the HF (sub)models inside `model`, found once per model: the HF engine switches its
    text model's attention every decode step, and walking a 3B model's 839 modules each time is CPU the
    step need not spend."""
    if model not in _CONFIGS:
        _CONFIGS[model] = [m.config for m in model.modules() if isinstance(m, PreTrainedModel)]
    return _CONFIGS[model]
