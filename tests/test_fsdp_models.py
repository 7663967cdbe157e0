"""Actor, reference and critic loading, critic checkpoints, and the per-model training switches."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.vl_samples import mixed_samples
from vistarl.devtools.tiny_checkpoint import ARCHS
from vistarl.trainer.learner.fsdp import full_state_dict, shard_model
from vistarl.trainer.learner.logprobs import token_logprobs, token_values
from vistarl.trainer.learner.models import (
    ActorModel,
    CriticModel,
    blocks,
    load_actor,
    load_critic,
    load_lm,
    load_reference,
    save_critic,
)
from vistarl.trainer.learner.packing import PackedBatch, pack_sequences
from vistarl.trainer.rollout.processor import VLProcessor


def batch_for(model: ActorModel | CriticModel, path: Path) -> PackedBatch:
    """Two of the mixed samples: one with an image, one without."""
    processor = VLProcessor.from_pretrained(path)
    return pack_sequences(mixed_samples(processor)[:2], processor, model.model.get_rope_index)


def test_reference_and_critic_load_only_when_asked(tiny_qwen25: Path) -> None:
    actor, reference, critic = load_actor(tiny_qwen25), load_reference(tiny_qwen25), load_critic(tiny_qwen25)
    assert actor.training and critic.training and not reference.training
    assert not any(p.requires_grad for p in reference.parameters())
    assert all(p.requires_grad for p in actor.parameters())
    assert torch.all(critic.value_head.weight == 0)


def test_actor_state_dict_has_the_hf_model_names(tiny_qwen25: Path) -> None:
    lm = load_lm(tiny_qwen25)
    actor_keys = set(full_state_dict(ActorModel.from_lm(lm)))
    assert actor_keys == set(lm.state_dict())
    assert "lm_head.weight" in actor_keys


@pytest.mark.parametrize("arch", ARCHS)
def test_blocks_are_decoder_layers_and_vision_blocks(tiny_checkpoints: dict[str, Path], arch: str) -> None:
    lm = load_lm(tiny_checkpoints[arch])
    found = blocks(ActorModel.from_lm(lm))
    text, vision = lm.config.text_config.num_hidden_layers, lm.config.vision_config.depth
    assert len(found) == text + vision
    assert {type(b).__name__ for b in found} == set(lm.model._no_split_modules)


def test_critic_checkpoint_round_trip(tiny_qwen25: Path, tmp_path: Path) -> None:
    critic = load_critic(tiny_qwen25)
    torch.nn.init.normal_(critic.value_head.weight, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        critic.model.language_model.norm.weight.mul_(1.5)  # a trained backbone differs from the policy's
    saved = save_critic(full_state_dict(critic), critic.config, tmp_path / "critic")
    restored = load_critic(saved)
    expected, actual = full_state_dict(critic), full_state_dict(restored)
    assert set(actual) == set(expected)
    for name, tensor in expected.items():
        torch.testing.assert_close(actual[name], tensor, rtol=0, atol=0)
    batch = batch_for(critic, tiny_qwen25)
    with torch.no_grad():
        torch.testing.assert_close(token_values(restored, batch), token_values(critic, batch))
    with pytest.raises(ValueError, match="not a critic state dict"):
        save_critic(full_state_dict(ActorModel.from_lm(load_lm(tiny_qwen25))), critic.config, tmp_path / "x")


def test_gradient_checkpointing_and_frozen_vision(tiny_qwen25: Path) -> None:
    """Checkpointing (all decoder layers but the last) changes no gradient; a frozen vision tower still
    runs but gets none."""

    def grads(
        checkpointing: bool, vision_frozen: bool, uncheckpointed: int = 0
    ) -> dict[str, torch.Tensor | None]:
        actor = load_actor(tiny_qwen25)
        actor = shard_model(
            actor,
            torch.device("cpu"),
            gradient_checkpointing=checkpointing,
            uncheckpointed_layers=uncheckpointed,
            vision_frozen=vision_frozen,
        )
        layers = list(actor.model.language_model.layers)
        kept = layers[len(layers) - uncheckpointed :] if uncheckpointed else []
        assert all(
            block.gradient_checkpointing == (checkpointing and block not in kept) for block in blocks(actor)
        )
        batch = batch_for(actor, tiny_qwen25)
        (token_logprobs(actor, batch, 1.0).logprobs * batch.advantages).sum().backward()
        return {name: p.grad for name, p in actor.named_parameters()}

    plain = grads(checkpointing=False, vision_frozen=False)
    checkpointed = grads(checkpointing=True, vision_frozen=True, uncheckpointed=1)
    for name, grad in plain.items():
        other = checkpointed[name]
        if ".visual." in f".{name}":
            assert other is None
        else:
            assert grad is not None and other is not None
            torch.testing.assert_close(other, grad, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("arch", ARCHS)
def test_mlp_checkpoint_scope_recomputes_only_the_mlp(tiny_checkpoints: dict[str, Path], arch: str) -> None:
    """With `checkpoint_scope="mlp"` backward runs each checkpointed decoder layer's MLP again but not its
    attention (the last layer, uncheckpointed, runs nothing again), and every gradient is unchanged."""
    path = tiny_checkpoints[arch]

    def run(scope: str | None) -> tuple[list[tuple[int, int]], dict[str, torch.Tensor]]:
        actor = load_actor(path)
        actor = shard_model(
            actor,
            torch.device("cpu"),
            gradient_checkpointing=scope is not None,
            uncheckpointed_layers=1 if scope is not None else 0,
            checkpoint_scope=scope or "layer",
        )
        layers = list(actor.model.language_model.layers)
        calls = [[0, 0] for _ in layers]
        for count, layer in zip(calls, layers, strict=True):
            for slot, projection in enumerate((layer.self_attn.q_proj, layer.mlp.gate_proj)):
                projection.register_forward_hook(lambda *_, c=count, i=slot: c.__setitem__(i, c[i] + 1))
        batch = batch_for(actor, path)
        (token_logprobs(actor, batch, 1.0).logprobs * batch.advantages).sum().backward()
        grads = {name: p.grad for name, p in actor.named_parameters() if p.grad is not None}
        return [(attention, mlp) for attention, mlp in calls], grads

    plain_calls, plain = run(None)
    layer_calls, _ = run("layer")
    mlp_calls, scoped = run("mlp")
    assert plain_calls == [(1, 1)] * len(plain_calls)
    assert layer_calls == [(2, 2)] * (len(plain_calls) - 1) + [(1, 1)]
    assert mlp_calls == [(1, 2)] * (len(plain_calls) - 1) + [(1, 1)]
    assert scoped.keys() == plain.keys()
    for name, grad in plain.items():
        torch.testing.assert_close(scoped[name], grad, rtol=1e-4, atol=1e-7)


@pytest.mark.slow  # a compile: minutes of CPU
@pytest.mark.parametrize("scope", ["layer", "mlp"])
def test_compiled_model_computes_the_same_logprobs_and_gradients(tiny_qwen25: Path, scope: str) -> None:
    """`compiled=True` (every decoder layer and vision block compiled, inside its layer checkpointing
    or around its MLP checkpointing, and the logprob chunks) changes no logprob and no gradient."""

    def run(compiled: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        torch.manual_seed(0)
        actor = load_actor(tiny_qwen25)
        actor = shard_model(
            actor,
            torch.device("cpu"),
            gradient_checkpointing=True,
            checkpoint_scope=scope,  # type: ignore[arg-type]
            compiled=compiled,
        )
        batch = batch_for(actor, tiny_qwen25)
        logprobs = token_logprobs(actor, batch, 1.0, compiled=compiled).logprobs
        logprobs.sum().backward()
        return logprobs.detach(), {name: p.grad for name, p in actor.named_parameters() if p.grad is not None}

    eager_logprobs, eager_grads = run(compiled=False)
    compiled_logprobs, compiled_grads = run(compiled=True)
    torch.testing.assert_close(compiled_logprobs, eager_logprobs, rtol=1e-4, atol=1e-5)
    assert compiled_grads.keys() == eager_grads.keys()
    assert any(".visual." in f".{name}" and grad.abs().sum() > 0 for name, grad in eager_grads.items())
    for name, grad in eager_grads.items():
        torch.testing.assert_close(compiled_grads[name], grad, rtol=1e-3, atol=1e-5)


def test_uncheckpointed_layers_and_scope_must_exist(tiny_qwen25: Path) -> None:
    actor = load_actor(tiny_qwen25)
    with pytest.raises(ValueError, match="uncheckpointed_layers must be in"):
        shard_model(actor, torch.device("cpu"), gradient_checkpointing=True, uncheckpointed_layers=99)
    with pytest.raises(ValueError, match="checkpoint scope must be 'layer' or 'mlp'"):
        shard_model(actor, torch.device("cpu"), gradient_checkpointing=True, checkpoint_scope="block")  # type: ignore[arg-type]
