"""One kernel where HF's modules launch several, for the decode step: a step at batch 128 runs thousands of
tiny kernels, so their count, not their bytes, sets much of its time (docs/benchmarks.md, "The HF engine's
decode step")."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

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
