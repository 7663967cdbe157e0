"""One kernel where HF's modules launch several, for decode steps and prompt passes: fused RMSNorms, and one
matrix product for the q/k/v projections and one for the MLP's gate/up. A step at batch 128 runs
thousands of tiny kernels, so their count, not their bytes, sets much of its time (docs/benchmarks.md,
"The HF engine's decode step")."""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn


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

    def outputs(self, hidden: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Each module's output for `hidden`, from one product."""
        product = F.linear(hidden, self.weight, self.bias)
        return product.split([m.out_features for m in self.modules], dim=-1)

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
    """A decoder layer's MLP, with its attention's q/k/v and its gate/up weights fused."""

    mlp: Any
    qkv: Fused
    gate_up: Fused

    @classmethod
    def of(cls, layer: Any) -> FusedLayer:
        attention, mlp = layer.self_attn, layer.mlp
        qkv = Fused.of((attention.q_proj, attention.k_proj, attention.v_proj))
        return cls(mlp, qkv, Fused.of((mlp.gate_proj, mlp.up_proj)))

    def intact(self) -> bool:
        return self.qkv.intact() and self.gate_up.intact()


@contextlib.contextmanager
def fused_projections(layers: list[FusedLayer]) -> Iterator[None]:
    """Run each layer's q/k/v projections as one product and its MLP's gate/up as another for the body of
    the `with`: a decode step at batch 128 spends much of its time in the fixed cost of small matrix
    products. HF's attention calls q, k and v in turn on the same input; the q call computes all three
    and the k and v calls take theirs (computing their own for any other input)."""
    if not all(layer.intact() for layer in layers):
        raise RuntimeError("a fused projection's weights were rebound, not updated in place")
    patched: list[Any] = []
    for layer in layers:
        q, k, v = cast(tuple[Any, Any, Any], layer.qkv.modules)
        stash = _Stash(layer.qkv)
        q.forward, k.forward, v.forward = (
            stash.first,
            functools.partial(stash.take, k, 1),
            functools.partial(stash.take, v, 2),
        )
        layer.mlp.forward = functools.partial(_gated_mlp, layer.mlp, layer.gate_up)
        patched += [q, k, v, layer.mlp]
    try:
        yield
    finally:
        for module in patched:
            del module.forward


class _Stash:
    """The outputs of one fused product, kept for the modules called after the first on the same input."""

    def __init__(self, fused: Fused) -> None:
        self.fused = fused
        self.input: torch.Tensor | None = None
        self.outputs: tuple[torch.Tensor, ...] = ()

    def first(self, hidden: torch.Tensor) -> torch.Tensor:
        self.input, self.outputs = hidden, self.fused.outputs(hidden)
        return self.outputs[0]

    def take(self, module: nn.Linear, index: int, hidden: torch.Tensor) -> torch.Tensor:
        if hidden is not self.input:
            return F.linear(hidden, module.weight, module.bias)
        output = self.outputs[index]
        if index == len(self.outputs) - 1:
            self.input, self.outputs = None, ()
        return output


def _gated_mlp(mlp: Any, gate_up: Fused, hidden: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.outputs(hidden)
    return mlp.down_proj(mlp.act_fn(gate) * up)


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
        """The fused norms and projections, for the body of the `with` (a prompt pass, a decode step)."""
        with fused_norms(self.norms), fused_projections(self.projections):
            yield


_FUSIONS: weakref.WeakKeyDictionary[Any, Fusions] = weakref.WeakKeyDictionary()
