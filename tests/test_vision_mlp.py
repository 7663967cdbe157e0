"""Misaligned gated MLPs on padded weights: the same outputs and gradients, the same parameters."""

from __future__ import annotations

import torch
from torch import nn
from transformers import Qwen2_5_VLConfig
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLMLP

from vistarl.trainer.learner.vision_mlp import align_gated_mlps


def test_a_padded_mlp_computes_the_same_function_and_gradients() -> None:
    config = Qwen2_5_VLConfig(vision_config={"hidden_size": 16, "intermediate_size": 20}).vision_config
    torch.manual_seed(0)
    reference = Qwen2_5_VLMLP(config, bias=True)
    padded = Qwen2_5_VLMLP(config, bias=True)
    padded.load_state_dict(reference.state_dict())
    assert align_gated_mlps(padded) == 1  # 20 is not a multiple of 8
    x = torch.randn(5, 16, requires_grad=True)
    torch.testing.assert_close(padded(x), reference(x), rtol=0, atol=1e-6)
    padded(x).square().sum().backward()
    grads = {name: p.grad.clone() for name, p in padded.named_parameters()}
    input_grad = x.grad.clone()
    x.grad = None
    reference(x).square().sum().backward()
    torch.testing.assert_close(x.grad, input_grad, rtol=0, atol=1e-6)
    for name, p in reference.named_parameters():
        assert grads[name].shape == p.shape
        torch.testing.assert_close(grads[name], p.grad, rtol=0, atol=1e-6)
    assert set(padded.state_dict()) == set(reference.state_dict())


def test_aligned_mlps_are_left_alone() -> None:
    config = Qwen2_5_VLConfig(vision_config={"hidden_size": 16, "intermediate_size": 24}).vision_config
    mlp = Qwen2_5_VLMLP(config, bias=True)
    assert align_gated_mlps(mlp) == 0 and type(mlp) is Qwen2_5_VLMLP


def test_compiled_padded_mlps_share_one_graph() -> None:
    """Every padded MLP must reuse one compiled graph: a per-instance forward recompiled per vision
    block until torch.compile gave up and ran the rest eagerly."""
    config = Qwen2_5_VLConfig(vision_config={"hidden_size": 16, "intermediate_size": 20}).vision_config
    blocks = [Block(Qwen2_5_VLMLP(config, bias=True)) for _ in range(6)]
    for block in blocks:
        align_gated_mlps(block)
        block.compile(backend="eager")
    torch._dynamo.reset()
    with torch._dynamo.config.patch(recompile_limit=2, fail_on_recompile_limit_hit=True):
        for block in blocks:
            block(torch.randn(3, 16))


class Block(nn.Module):
    """An MLP called after a graph break (vision blocks have one on the CPU attention path)."""

    def __init__(self, mlp: nn.Module) -> None:
        super().__init__()
        self.mlp = mlp

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        torch._dynamo.graph_break()
        return self.mlp(hidden)
