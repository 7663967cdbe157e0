"""One kernel where HF's modules launch several, for decode steps and prompt passes: fused RMSNorms, one
matrix product for the q/k/v projections and one for the MLP's gate/up; and the text attention's rotary
embedding in four elementwise kernels for q and k together (five on Qwen3-VL, which joins its normed q and
k first) where HF launches ten. A step at batch 128 runs thousands of tiny kernels, so their count, not
their bytes, sets much of its time (docs/benchmarks.md, "The HF engine's decode step")."""

from __future__ import annotations

import contextlib
import functools
import sys
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS


def rms_norms(model: nn.Module) -> list[nn.Module]:
    """The Qwen RMSNorms inside `model`, found once: a decode step should not walk the model's modules."""
    return [
        m for m in model.modules() if type(m).__name__.endswith("RMSNorm") and hasattr(m, "variance_epsilon")
    ]


@contextlib.contextmanager
def fused_norms(norms: list[nn.Module]) -> Iterator[None]:
    """Run the RMSNorms `norms` as torch's `rms_norm` for the body of the `with`: one fused kernel, where
    HF's forward launches eight (fp32 cast, square, mean, add, rsqrt, product, cast, weight). The same
    sums, rounded once at the end instead of before the weight, within bf16's tolerance."""
    for norm in norms:
        norm.forward = functools.partial(_rms_norm, norm)
    try:
        yield
    finally:
        for norm in norms:
            del norm.forward


def _rms_norm(norm: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    weight = norm.get_parameter("weight")
    return F.rms_norm(hidden, tuple(weight.shape), weight, float(norm.variance_epsilon))  # type: ignore[arg-type]


@dataclass(frozen=True)
class Fused:
    """Linear layers that read the same input, their weights (and biases) rebound as consecutive rows of
    one tensor: one matrix product computes all their outputs."""

    modules: tuple[nn.Linear, ...]
    weight: torch.Tensor
    bias: torch.Tensor | None

    @classmethod
    def of(cls, modules: tuple[nn.Linear, ...]) -> Fused:
        """Copy `modules`' weights into one tensor and make each module's weight a view of its rows: the
        same values and names, no second copy, and an in-place weight update reaches both."""
        weight = torch.cat([m.weight.detach() for m in modules])
        biases = [m.bias for m in modules]
        present = [b.detach() for b in biases if b is not None]
        if present and len(present) < len(modules):
            raise ValueError("fused projections need a bias on all of them or on none")
        bias = torch.cat(present) if present else None
        start = 0
        for module in modules:
            rows = slice(start, start + module.out_features)
            module.weight = nn.Parameter(weight[rows], requires_grad=module.weight.requires_grad)
            if bias is not None:
                module.bias = nn.Parameter(bias[rows], requires_grad=module.bias.requires_grad)
            start = rows.stop
        return cls(modules, weight, bias)

    def product(self, hidden: torch.Tensor) -> torch.Tensor:
        """All the modules' outputs for `hidden`, side by side in the last dimension."""
        return F.linear(hidden, self.weight, self.bias)

    def outputs(self, hidden: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Each module's output for `hidden`, from one product."""
        return self.product(hidden).split([m.out_features for m in self.modules], dim=-1)

    def intact(self) -> bool:
        """Whether the modules' weights are still this tensor's rows (nothing rebound them since)."""
        storage = self.weight.untyped_storage().data_ptr()
        return all(m.weight.untyped_storage().data_ptr() == storage for m in self.modules)


def fuse_projections(text_model: Any) -> list[FusedLayer]:
    """Each decoder layer of `text_model` with its q/k/v and its MLP's gate/up projections fused
    (`Fused.of`)."""
    return [FusedLayer.of(layer) for layer in text_model.layers]


@dataclass(frozen=True)
class FusedLayer:
    """A decoder layer's attention and MLP, with the attention's q/k/v and the MLP's gate/up weights fused."""

    attention: Any
    mlp: Any
    qkv: Fused
    gate_up: Fused

    @classmethod
    def of(cls, layer: Any) -> FusedLayer:
        attention, mlp = layer.self_attn, layer.mlp
        qkv = Fused.of((attention.q_proj, attention.k_proj, attention.v_proj))
        return cls(attention, mlp, qkv, Fused.of((mlp.gate_proj, mlp.up_proj)))

    def intact(self) -> bool:
        return self.qkv.intact() and self.gate_up.intact()


@contextlib.contextmanager
def fused_mlps(layers: list[FusedLayer]) -> Iterator[None]:
    """Run each layer's MLP with its gate/up projections as one product for the body of the `with`: a
    decode step at batch 128 spends much of its time in the fixed cost of small matrix products."""
    _refuse_rebound(layers)
    for layer in layers:
        layer.mlp.forward = functools.partial(_gated_mlp, layer.mlp, layer.gate_up)
    try:
        yield
    finally:
        for layer in layers:
            del layer.mlp.forward


def _refuse_rebound(layers: list[FusedLayer]) -> None:
    """Fail where a weight was rebound (`Fused.intact`): the fused product would compute with the old one."""
    if not all(layer.intact() for layer in layers):
        raise RuntimeError("a fused projection's weights were rebound, not updated in place")


def _gated_mlp(mlp: Any, gate_up: Fused, hidden: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.outputs(hidden)
    return mlp.down_proj(mlp.act_fn(gate) * up)


@contextlib.contextmanager
def fused_attentions(layers: list[FusedLayer]) -> Iterator[None]:
    """Run each layer's attention as `_attention` for the body of the `with`: HF's Qwen2.5-VL and Qwen3-VL
    text attention, with q, k and v from one product (its q/k/v modules go uncalled), and q and k rotated
    together in four elementwise kernels (`rotated`) where HF's `apply_rotary_pos_emb` launches five for
    each. Patched per module, as the other fusions: another model (a learner's, on another thread) runs
    HF's own."""
    _refuse_rebound(layers)
    sines = _SignedSines()
    for layer in layers:
        layer.attention.forward = functools.partial(_attention, layer.attention, layer.qkv, sines)
    try:
        yield
    finally:
        for layer in layers:
            del layer.attention.forward


def rotated(x: torch.Tensor, cos: torch.Tensor, signed: torch.Tensor) -> torch.Tensor:
    """HF's `x * cos + rotate_half(x) * sin`, bit for bit, in four kernels where HF's takes five:
    rotate_half's slices and concatenation as one flip of the two halves (a roll would copy a strided `x`
    first on a GPU), its negation moved onto the sine (`signed`, from `signed_sin`). Exact, as
    (-a) * b == a * (-b); the products and their sum are rounded as HF's are."""
    return x * cos + x.unflatten(-1, (2, -1)).flip(-2).flatten(-2) * signed


def signed_sin(sin: torch.Tensor) -> torch.Tensor:
    """`sin` with its first half negated: the sine `rotated` takes, rotate_half's negation moved onto it."""
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


class _SignedSines:
    """`signed_sin` of the text model's rotary sine, made once a forward pass: every layer gets the same
    `sin`."""

    def __init__(self) -> None:
        self.last: tuple[torch.Tensor, torch.Tensor] | None = None  # a sine, and it signed

    def of(self, sin: torch.Tensor) -> torch.Tensor:
        if self.last is None or self.last[0] is not sin:
            self.last = sin, signed_sin(sin)
        return self.last[1]


def _attention(
    attention: Any,
    qkv: Fused,
    sines: _SignedSines,
    hidden_states: torch.Tensor,
    position_embeddings: tuple[torch.Tensor, torch.Tensor],
    attention_mask: torch.Tensor | None = None,
    cache: Any = None,
    past_key_values: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """HF's text attention (Qwen2.5-VL's, and Qwen3-VL's with its per-head q/k norms) from the fused q/k/v
    product, q and k rotated as one tensor: the heads of both, side by side in the product (or joined
    after Qwen3-VL's norms). The decoder layer passes the KV cache as `cache`, or as `past_key_values`
    before transformers renamed it (5.17 does)."""
    cache = cache if cache is not None else past_key_values
    config = attention.config
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    product = qkv.product(hidden_states).unflatten(-1, (-1, attention.head_dim))
    qk, value = product.split([heads + kv_heads, kv_heads], dim=-2)
    if hasattr(attention, "q_norm"):
        qk = torch.cat((attention.q_norm(qk[..., :heads, :]), attention.k_norm(qk[..., heads:, :])), dim=-2)
    cos, sin = position_embeddings
    qk = rotated(qk, cos.unsqueeze(-2), sines.of(sin).unsqueeze(-2))
    query, key = qk.transpose(1, 2).split([heads, kv_heads], dim=1)
    value = value.transpose(1, 2)
    if cache is not None:
        key, value = cache.update(key, value, attention.layer_idx, kwargs=kwargs)
    eager = sys.modules[type(attention).__module__].eager_attention_forward
    out, weights = ALL_ATTENTION_FUNCTIONS.get_interface(config._attn_implementation, eager)(
        attention,
        query,
        key,
        value,
        attention_mask,
        dropout=attention.attention_dropout if attention.training else 0.0,
        scaling=attention.scaling,
        sliding_window=getattr(attention, "sliding_window", None),
        **kwargs,
    )
    return attention.o_proj(out.reshape(*hidden_states.shape[:-1], -1).contiguous()), weights


@dataclass(frozen=True)
class Fusions:
    """A model's RMSNorms and its text layers' fused projections, found and made once, by its engine."""

    norms: list[nn.Module]
    projections: list[FusedLayer]

    @classmethod
    def of(cls, model: Any) -> Fusions:
        """`model`'s, made once: engines built on one model share them (fusing again would rebind the
        weights an earlier engine's fusions hold)."""
        made = _FUSIONS.get(model)
        if made is None or not made.intact():
            made = _FUSIONS[model] = cls(rms_norms(model), fuse_projections(model.model.language_model))
        return made

    def intact(self) -> bool:
        return all(layer.intact() for layer in self.projections)

    @contextlib.contextmanager
    def applied(self) -> Iterator[None]:
        """The fused norms, MLPs and attentions, for the body of the `with` (a prompt pass, a decode step)."""
        with fused_norms(self.norms), fused_mlps(self.projections), fused_attentions(self.projections):
            yield


_FUSIONS: weakref.WeakKeyDictionary[Any, Fusions] = weakref.WeakKeyDictionary()
