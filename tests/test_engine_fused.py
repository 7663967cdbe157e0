"""The decode step's fused projections (`trainer/rollout/engines/hf/fused.py`): one product for q/k/v and
one for the MLP's gate/up give what the separate layers give, and in-place weight updates reach them; the
rotary embedding in fewer kernels gives HF's bit for bit."""

from __future__ import annotations

import asyncio
import contextlib
import copy

import pytest
import torch
from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl
from transformers.models.qwen3_vl import modeling_qwen3_vl

from tests.hf_models import Loaded
from tests.test_engine_hf import greedy, images, sampled, user_turn
from vistarl.trainer.rollout.engines.base import GenerateRequest
from vistarl.trainer.rollout.engines.hf import HFEngine
from vistarl.trainer.rollout.engines.hf.fused import (
    Fused,
    Fusions,
    fuse_projections,
    fused_attentions,
    fused_mlps,
    rotated,
    signed_sin,
)
from vistarl.trainer.rollout.engines.sglang_api import SamplingParams


def hidden_of(loaded: Loaded) -> torch.Tensor:
    """The text model's last hidden states for a few tokens, as HF runs it (no fused projections)."""
    model, _ = loaded
    ids = torch.arange(10, 22)[None]
    with torch.inference_mode():
        return model.model.language_model(input_ids=ids).last_hidden_state


@pytest.mark.parametrize("arch", ["qwen2_5_vl", "qwen3_vl"])
def test_fused_projections_give_the_separate_layers_outputs_and_follow_in_place_updates(
    request: pytest.FixtureRequest, arch: str
) -> None:
    model, processor = copy.deepcopy(request.getfixturevalue("qwen25" if arch == "qwen2_5_vl" else "qwen3"))
    separate = hidden_of((model, processor))
    layers = fuse_projections(model.model.language_model)
    first = layers[0]
    assert first.qkv.modules[1].weight.data_ptr() != first.qkv.weight.data_ptr()  # k's rows, after q's
    with fused_mlps(layers), fused_attentions(layers):
        assert "forward" in vars(first.mlp) and "forward" in vars(first.attention)
        fused = hidden_of((model, processor))
    assert "forward" not in vars(first.mlp) and "forward" not in vars(first.attention)
    torch.testing.assert_close(fused, separate, atol=1e-5, rtol=1e-5)

    with torch.no_grad():  # as `update_weights` does: in place, into the named parameters
        first.qkv.modules[1].weight.mul_(3.0)
        first.gate_up.modules[1].weight.add_(0.5)
    updated = hidden_of((model, processor))
    with fused_mlps(layers), fused_attentions(layers):
        fused = hidden_of((model, processor))
    assert not torch.allclose(updated, separate, atol=1e-3)
    torch.testing.assert_close(fused, updated, atol=1e-5, rtol=1e-5)


class RecordedCache:
    """A KV cache that keeps what each attention layer hands it."""

    def __init__(self) -> None:
        self.updates: list[tuple[int, torch.Size]] = []

    def update(
        self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self.updates.append((layer_idx, key.shape))
        return key, value


@pytest.mark.parametrize("name", ["cache", "past_key_values"])
def test_the_fused_attention_fills_the_kv_cache_under_either_of_its_names(qwen25: Loaded, name: str) -> None:
    """transformers 5.24's decoder layer hands the attention its KV cache as `cache`, 5.17's as
    `past_key_values`: the fused attention writes to it under both (the engine's prompt pass reads it)."""
    model, _ = copy.deepcopy(qwen25)
    text = model.model.language_model
    layers = fuse_projections(text)
    hidden = torch.randn(1, 4, text.config.hidden_size)
    embeddings = text.rotary_emb(hidden, torch.arange(4).expand(3, 1, 4))
    cache = RecordedCache()
    with torch.inference_mode(), fused_attentions(layers):
        layers[1].attention(hidden, position_embeddings=embeddings, attention_mask=None, **{name: cache})
    kv_heads, head_dim = text.config.num_key_value_heads, layers[1].attention.head_dim
    assert cache.updates == [(1, torch.Size([1, kv_heads, 4, head_dim]))]


def test_weights_rebound_instead_of_updated_in_place_are_refused(qwen25: Loaded) -> None:
    model, _ = copy.deepcopy(qwen25)
    layers = fuse_projections(model.model.language_model)
    q_proj = layers[0].qkv.modules[0]
    q_proj.weight = torch.nn.Parameter(q_proj.weight.detach().clone(), requires_grad=False)
    for fusion in (fused_mlps, fused_attentions):
        with pytest.raises(RuntimeError, match="rebound, not updated in place"), fusion(layers):
            pass


async def test_prompt_passes_run_fused_and_engines_on_one_model_share_its_fusions(
    qwen25: Loaded, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, processor = copy.deepcopy(qwen25)
    products: list[int] = []
    product = Fused.product

    def counted(self: Fused, hidden: torch.Tensor) -> torch.Tensor:
        products.append(hidden.shape[-2])
        return product(self, hidden)

    monkeypatch.setattr(Fused, "product", counted)
    first, second = HFEngine(model, processor, batch_wait_s=0.0), HFEngine(model, processor, batch_wait_s=0.0)
    assert first.fusions is second.fusions is Fusions.of(model)
    ids = processor.tokenizer.encode("<|im_start|>user\nfused<|im_end|>\n<|im_start|>assistant\n")
    sampling = SamplingParams(max_new_tokens=1, temperature=0.0)
    await first.generate(GenerateRequest(engine_ids=ids, sampling=sampling))
    layers = model.config.get_text_config().num_hidden_layers
    assert products == [len(ids)] * 2 * layers  # the prompt pass: q/k/v and gate/up, once a layer each
    await first.close()
    await second.close()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_rotary_embedding_of_q_and_k_together_is_hfs_bit_for_bit(dtype: torch.dtype) -> None:
    """`rotated` over q and k side by side gives the bits of both architectures' `apply_rotary_pos_emb`."""
    generator = torch.Generator().manual_seed(0)
    batch, tokens, heads, kv_heads, dim = 3, 5, 8, 2, 32
    qk = (torch.randn(batch, tokens, heads + kv_heads, dim, generator=generator) * 4).to(dtype)
    qk[0, 0, 0, :4] = torch.tensor([0.0, -0.0, 0.0, -0.0])  # zeros keep their signs too
    angles = torch.rand(batch, tokens, dim // 2, generator=generator) * 300
    cos, sin = (torch.cat((f, f), dim=-1).to(dtype) for f in (angles.cos(), angles.sin()))

    ours = rotated(qk, cos.unsqueeze(-2), signed_sin(sin).unsqueeze(-2)).transpose(1, 2)
    query, key = qk.transpose(1, 2).split([heads, kv_heads], dim=1)
    bits = torch.int32 if dtype == torch.float32 else torch.int16
    for module in (modeling_qwen2_5_vl, modeling_qwen3_vl):
        hf = torch.cat(module.apply_rotary_pos_emb(query, key, cos, sin), dim=1)
        assert torch.equal(ours.contiguous().view(bits), hf.contiguous().view(bits))


@pytest.mark.parametrize("arch", ["qwen2_5_vl", "qwen3_vl"])
async def test_the_engine_decodes_as_with_hfs_attention_with_its_attention_fused(
    request: pytest.FixtureRequest, arch: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same tokens and logprobs, exactly, with `fused_attentions` and with HF's attention and separate
    q/k/v products: a prompt pass of prompts with and without images, then static decode steps, greedy and
    sampled, as rows finish. One batch each time: when rows join a running batch depends on when they
    arrive, and other steps' rows round differently."""
    model, processor = copy.deepcopy(request.getfixturevalue("qwen25" if arch == "qwen2_5_vl" else "qwen3"))
    requests = [
        GenerateRequest(engine_ids=user_turn(processor, "rotate"), sampling=greedy(6)),
        GenerateRequest(
            engine_ids=user_turn(processor, "one", 1), images=images(3, (32, 32)), sampling=sampled(9, 1)
        ),
        GenerateRequest(engine_ids=user_turn(processor, "later, longer"), sampling=sampled(5, 2)),
    ]
    runs = []
    for fused in (True, False):
        if not fused:
            monkeypatch.setattr(
                f"{fused_attentions.__module__}.fused_attentions", lambda _: contextlib.nullcontext()
            )
        engine = HFEngine(model, processor, max_batch_size=3, batch_wait_s=1.0, static_cache_len=200)
        runs.append(await asyncio.gather(*(engine.generate(r) for r in requests)))
        assert engine.stats.static_batches == engine.stats.batches == 1
        await engine.close()
    for with_fused, without in zip(*runs, strict=True):
        assert (with_fused.output_ids, with_fused.logprobs) == (without.output_ids, without.logprobs)
