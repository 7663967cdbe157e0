"""Varlen attention for packed rows: sequence bounds, and the logprobs of HF's SDPA path."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from tests.vl_samples import mixed_samples
from vistarl.devtools.tiny_checkpoint import ARCHS
from vistarl.trainer.learner.logprobs import token_logprobs
from vistarl.trainer.learner.models import ActorModel, load_lm
from vistarl.trainer.learner.packing import PackedBatch, pack_sequences
from vistarl.trainer.modeling import attention
from vistarl.trainer.modeling.attention import (
    SDPA_ATTENTION,
    SEQUENCE_SDPA_ATTENTION,
    VARLEN_ATTENTION,
    attention_for,
    packed_attention_kwargs,
    sequence_bounds,
    use_attention,
)
from vistarl.trainer.rollout.processor import VLProcessor


def reference_varlen_attn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_q: torch.Tensor,
    cu_k: torch.Tensor,
    max_q: int,
    max_k: int,
    *,
    scale: float | None = None,
    window_size: tuple[int, int] = (-1, -1),
    enable_gqa: bool = False,
) -> torch.Tensor:
    """torch's `varlen_attn` computed one sequence at a time with SDPA: a CPU stand-in for the CUDA kernel,
    which shares each kv head among its group of query heads."""
    assert torch.equal(cu_q, cu_k) and max_q == max_k == int(cu_q.diff().max())
    assert enable_gqa == bool(attention._GQA)  # the flag goes with every call, where torch has it
    out = torch.empty_like(q)
    for start, end in itertools.pairwise(cu_q.tolist()):
        heads_first = [x[start:end].transpose(0, 1) for x in (q, k, v)]
        causal = window_size == (-1, 0)
        out[start:end] = F.scaled_dot_product_attention(
            *heads_first, is_causal=causal, scale=scale, enable_gqa=k.shape[1] != q.shape[1]
        ).transpose(0, 1)
    return out


def packed(lm: PreTrainedModel, path: Path) -> PackedBatch:
    """The three mixed samples (images of several sizes, one without) in one row."""
    processor = VLProcessor.from_pretrained(path)
    return pack_sequences(mixed_samples(processor), processor, lm.model.get_rope_index)


def logprobs_with(lm: PreTrainedModel, batch: PackedBatch, implementation: str) -> torch.Tensor:
    """Token logprobs of `batch` with `lm` switched to `implementation`."""
    use_attention(lm, implementation)
    with torch.no_grad():
        return token_logprobs(ActorModel.from_lm(lm), batch, temperature=1.0).logprobs


def test_sequence_bounds_follow_the_packed_text_positions(tiny_qwen25: Path) -> None:
    lm = load_lm(tiny_qwen25)
    batch = packed(lm, tiny_qwen25)
    cu_seqlens, longest = sequence_bounds(batch.position_ids[0], 1, batch.num_tokens, torch.device("cpu"))
    assert cu_seqlens.tolist() == batch.cu_seqlens.tolist()  # images present: no dummy segment
    assert cu_seqlens.dtype == torch.int32 and longest == int(batch.cu_seqlens.diff().max())
    assert (
        torch.equal(batch.bounds.cu_seqlens, cu_seqlens) and batch.bounds.longest == longest
    )  # packed on host
    rows, _ = sequence_bounds(None, 3, 5, torch.device("cpu"))
    assert rows.tolist() == [0, 5, 10, 15]
    with pytest.raises(ValueError, match="restart at 0"):
        sequence_bounds(torch.arange(1, 6)[None, :], 1, 5, torch.device("cpu"))


def test_use_attention_switches_text_and_vision(tiny_qwen25: Path) -> None:
    lm = load_lm(tiny_qwen25)
    use_attention(lm, VARLEN_ATTENTION)
    configs = [lm.config, lm.model.language_model.config, lm.model.visual.config]
    assert {c._attn_implementation for c in configs} == {VARLEN_ATTENTION}
    use_attention(lm, SDPA_ATTENTION)
    assert {c._attn_implementation for c in configs} == {SDPA_ATTENTION}


@pytest.mark.parametrize("arch", ARCHS)
def test_varlen_path_matches_sdpa(
    tiny_checkpoints: dict[str, Path], arch: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Layouts, grouped kv heads, text bounds and vision windows, with the kernel computed per sequence."""
    monkeypatch.setattr(attention, "varlen_attn", reference_varlen_attn)
    bounds_calls = []
    monkeypatch.setattr(
        attention, "sequence_bounds", lambda *a: bounds_calls.append(a) or sequence_bounds(*a)
    )
    lm = load_lm(tiny_checkpoints[arch])
    batch = packed(lm, tiny_checkpoints[arch])
    expected = logprobs_with(lm, batch, SDPA_ATTENTION)
    torch.testing.assert_close(logprobs_with(lm, batch, VARLEN_ATTENTION), expected, rtol=0, atol=1e-5)
    assert not bounds_calls  # the packed batch brings its bounds: no layer asks the GPU for them


@pytest.mark.parametrize("arch", ARCHS)
def test_sequence_sdpa_runs_a_packed_row_as_sdpa(tiny_checkpoints: dict[str, Path], arch: str) -> None:
    """SDPA once per sequence in the text model, from the packed row's bounds (the HF engine's prompt pass
    off the GPU), gives the hidden states of HF's SDPA over the row's block mask; SDPA comes back after."""
    lm = load_lm(tiny_checkpoints[arch])
    batch = packed(lm, tiny_checkpoints[arch])
    text = lm.model.language_model
    embeds = text.get_input_embeddings()(batch.input_ids)
    inputs = {"inputs_embeds": embeds, "position_ids": batch.position_ids}
    with torch.no_grad():
        expected = text(**inputs, use_cache=False).last_hidden_state
        with attention_for(text, SEQUENCE_SDPA_ATTENTION):
            kwargs = packed_attention_kwargs(text.config, batch.bounds)
            hidden = text(**inputs, use_cache=False, **kwargs).last_hidden_state
    assert set(kwargs) == {"packed_cu_seqlens", "packed_max_seqlen"}
    torch.testing.assert_close(hidden, expected, rtol=0, atol=1e-5)
    assert text.config._attn_implementation == SDPA_ATTENTION


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ARCHS)
def test_varlen_kernel_packed_matches_unpacked_in_bf16(tiny_checkpoints: dict[str, Path], arch: str) -> None:
    """On GPU in bf16: packed rows on the real kernel score like each sequence alone, and like SDPA."""
    path = tiny_checkpoints[arch]
    lm = load_lm(path, dtype=torch.bfloat16).cuda().train()
    processor = VLProcessor.from_pretrained(path)
    samples, rope_index = mixed_samples(processor), lm.model.get_rope_index
    batch = pack_sequences(samples, processor, rope_index).to("cuda")
    varlen = logprobs_with(lm, batch, VARLEN_ATTENTION)
    alone = [
        logprobs_with(
            lm, pack_sequences([s], processor, rope_index, dummy_image=False).to("cuda"), VARLEN_ATTENTION
        )
        for s in samples
    ]
    sdpa = logprobs_with(lm, batch, SDPA_ATTENTION)
    torch.testing.assert_close(varlen, torch.cat(alone), rtol=0, atol=2e-2)
    torch.testing.assert_close(varlen, sdpa, rtol=0, atol=2e-2)
    use_attention(lm, VARLEN_ATTENTION)
    logprobs = token_logprobs(ActorModel.from_lm(lm), batch, temperature=1.0).logprobs
    logprobs.sum().backward()
    grads = [p.grad for p in lm.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    assert lm.model.visual.blocks[0].attn.qkv.weight.grad.abs().sum() > 0


def cached_prefix_row(device: str, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """A packed row of three sequences (13, 7 and 20 tokens, 8 query heads, 2 kv heads) whose first 9, 0 and
    16 tokens are cached: each sequence's queries are its other tokens', its keys all of its tokens'; what
    the row must give (each sequence attended whole, causal, at those queries); and the queries' and the
    keys' `cu_seqlens`."""
    generator = torch.Generator().manual_seed(0)
    lengths, cached = [13, 7, 20], [9, 0, 16]
    whole = [torch.randn(3, 1, 8, n, 16, generator=generator) for n in lengths]
    query = torch.cat([w[0, :, :, c:] for w, c in zip(whole, cached, strict=True)], dim=2)
    key = torch.cat([w[1, :, :2] for w in whole], dim=2)
    value = torch.cat([w[2, :, :2] for w in whole], dim=2)
    expected = torch.cat(
        [
            F.scaled_dot_product_attention(w[0], w[1, :, :2], w[2, :, :2], is_causal=True, enable_gqa=True)[
                :, :, c:
            ]
            for w, c in zip(whole, cached, strict=True)
        ],
        dim=2,
    ).transpose(1, 2)
    ends = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)
    computed = torch.tensor([0, *itertools.accumulate(n - c for n, c in zip(lengths, cached, strict=True))])
    tensors = (query, key, value, expected, computed.int(), ends)
    return tuple(t.to(device, dtype) if t.is_floating_point() else t.to(device) for t in tensors)


def test_cached_keys_put_the_causal_mask_at_the_sequences_end() -> None:
    """With fewer queries than keys (a prompt pass after a cached prefix), each query attends to the keys up
    to its own token, as in the whole sequence's attention."""
    query, key, value, expected, cu_q, cu_k = cached_prefix_row("cpu", torch.float32)
    out, _ = attention.sequence_sdpa_attention(
        torch.nn.Module(),
        query,
        key,
        value,
        None,
        is_causal=True,
        packed_cu_seqlens=cu_q,
        packed_cu_seqlens_k=cu_k,
    )
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-6)


@pytest.mark.gpu
def test_the_varlen_kernel_with_cached_keys_puts_the_causal_mask_at_the_end() -> None:
    """On the GPU, FlashAttention with the keys' bounds apart from the queries' aligns its causal mask at each
    sequence's end (bottom right), in bf16."""
    query, key, value, expected, cu_q, cu_k = cached_prefix_row("cuda", torch.bfloat16)
    out, _ = attention.varlen_attention(
        torch.nn.Module(),
        query,
        key,
        value,
        None,
        is_causal=True,
        packed_cu_seqlens=cu_q,
        packed_max_seqlen=7,
        packed_cu_seqlens_k=cu_k,
        packed_max_seqlen_k=20,
    )
    torch.testing.assert_close(out.float(), expected.float(), rtol=0, atol=2e-2)
