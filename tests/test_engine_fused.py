"""The decode step's fused projections (`trainer/rollout/engines/hf/fused.py`): one product for q/k/v and
one for the MLP's gate/up give what the separate layers give, and in-place weight updates reach them."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.hf_models import Loaded
from vistarl.trainer.rollout.engines.base import GenerateRequest
from vistarl.trainer.rollout.engines.hf import HFEngine
from vistarl.trainer.rollout.engines.hf.fused import Fused, Fusions, fuse_projections, fused_projections
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
    with fused_projections(layers):
        assert "forward" in vars(first.qkv.modules[0]) and "forward" in vars(first.mlp)
        fused = hidden_of((model, processor))
    assert "forward" not in vars(first.qkv.modules[0]) and "forward" not in vars(first.mlp)
    torch.testing.assert_close(fused, separate, atol=1e-5, rtol=1e-5)

    with torch.no_grad():  # as `update_weights` does: in place, into the named parameters
        first.qkv.modules[1].weight.mul_(3.0)
        first.gate_up.modules[1].weight.add_(0.5)
    updated = hidden_of((model, processor))
    with fused_projections(layers):
        fused = hidden_of((model, processor))
    assert not torch.allclose(updated, separate, atol=1e-3)
    torch.testing.assert_close(fused, updated, atol=1e-5, rtol=1e-5)


def test_weights_rebound_instead_of_updated_in_place_are_refused(qwen25: Loaded) -> None:
    model, _ = copy.deepcopy(qwen25)
    layers = fuse_projections(model.model.language_model)
    q_proj = layers[0].qkv.modules[0]
    q_proj.weight = torch.nn.Parameter(q_proj.weight.detach().clone(), requires_grad=False)
    with pytest.raises(RuntimeError, match="rebound, not updated in place"), fused_projections(layers):
        pass


async def test_prompt_passes_run_fused_and_engines_on_one_model_share_its_fusions(
    qwen25: Loaded, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, processor = copy.deepcopy(qwen25)
    products: list[int] = []
    outputs = Fused.outputs

    def counted(self: Fused, hidden: torch.Tensor) -> tuple[torch.Tensor, ...]:
        products.append(hidden.shape[-2])
        return outputs(self, hidden)

    monkeypatch.setattr(Fused, "outputs", counted)
    first, second = HFEngine(model, processor, batch_wait_s=0.0), HFEngine(model, processor, batch_wait_s=0.0)
    assert first.fusions is second.fusions is Fusions.of(model)
    ids = processor.tokenizer.encode("<|im_start|>user\nfused<|im_end|>\n<|im_start|>assistant\n")
    sampling = SamplingParams(max_new_tokens=1, temperature=0.0)
    await first.generate(GenerateRequest(engine_ids=ids, sampling=sampling))
    layers = model.config.get_text_config().num_hidden_layers
    assert products == [len(ids)] * 2 * layers  # the prompt pass: q/k/v and gate/up, once a layer each
    await first.close()
    await second.close()
