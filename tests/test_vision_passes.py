"""One vision-tower pass for several micro-batches gives the losses and gradients of one pass each."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tests.vl_samples import make_sample
from vistarl.devtools.tiny_checkpoint import ARCHS
from vistarl.trainer.learner.logprobs import token_logprobs, token_values
from vistarl.trainer.learner.models import ActorModel, CriticModel, load_actor, load_critic
from vistarl.trainer.learner.packing import PackedBatch, pack_sequences
from vistarl.trainer.learner.vision_passes import VisionPasses
from vistarl.trainer.modeling.image_features import ImageFeatures, encode_images
from vistarl.trainer.rollout.processor import VLProcessor

TEMPERATURE = 0.8


def micro_batches(model: ActorModel | CriticModel, path: Path) -> list[PackedBatch]:
    """Four micro-batches: two images of different sizes, none, one, and one again."""
    processor = VLProcessor.from_pretrained(path)
    rng = np.random.default_rng(3)
    groups = [
        [make_sample(processor, rng, 6, 9, [(56, 84)]), make_sample(processor, rng, 4, 7, [(56, 56)])],
        [make_sample(processor, rng, 10, 12)],
        [make_sample(processor, rng, 5, 8, [(84, 56)])],
        [make_sample(processor, rng, 7, 6, [(56, 56)])],
    ]
    rope_index = model.model.get_rope_index
    return [pack_sequences(g, processor, rope_index, dummy_image=False) for g in groups]


def actor_loss(actor: ActorModel, batch: PackedBatch, features: ImageFeatures | None) -> torch.Tensor:
    """A policy-gradient-shaped loss that reaches every scored token."""
    scores = token_logprobs(actor, batch, TEMPERATURE, image_features=features)
    return -(scores.logprobs * batch.advantages).sum()


def accumulate(actor: ActorModel, batches: list[PackedBatch], group: int | None) -> dict[str, torch.Tensor]:
    """Gradients summed over the micro-batches: one tower pass each (`group=None`) or shared."""
    actor.zero_grad(set_to_none=True)
    passes = VisionPasses(actor, batches, group) if group is not None else None
    for i, batch in enumerate(batches):
        actor_loss(actor, batch, passes.features(i) if passes else None).backward()
        if passes is not None:
            passes.backward(i)
    return {n: p.grad.clone() for n, p in actor.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("group", [2, 4])
def test_shared_tower_passes_give_the_same_gradients(
    tiny_checkpoints: dict[str, Path], arch: str, group: int
) -> None:
    actor = load_actor(tiny_checkpoints[arch])
    batches = micro_batches(actor, tiny_checkpoints[arch])
    separate = accumulate(actor, batches, group=None)
    shared = accumulate(actor, batches, group=group)
    assert separate.keys() == shared.keys()
    visual = [n for n in separate if ".visual." in n]
    assert visual and all(separate[n].abs().sum() > 0 for n in visual)
    for name in separate:
        torch.testing.assert_close(
            shared[name], separate[name], rtol=1e-4, atol=1e-5, msg=lambda m, name=name: f"{name}: {m}"
        )


def test_the_tower_runs_once_per_group(tiny_qwen25: Path) -> None:
    actor = load_actor(tiny_qwen25)
    batches = micro_batches(actor, tiny_qwen25)
    calls: list[int] = []
    actor.model.visual.register_forward_hook(lambda module, args, out: calls.append(args[0].shape[0]))
    accumulate(actor, batches, group=2)
    patches = [int(b.pixel_values.shape[0]) if b.pixel_values is not None else 0 for b in batches]
    assert calls == [patches[0] + patches[1], patches[2] + patches[3]]


def test_critic_values_and_no_grad_passes_match(tiny_qwen25: Path) -> None:
    critic = load_critic(tiny_qwen25)
    torch.nn.init.normal_(critic.value_head.weight, std=0.1)
    batches = micro_batches(critic, tiny_qwen25)
    with torch.no_grad():
        passes = VisionPasses(critic, batches, group=3)
        for i, batch in enumerate(batches):
            features = passes.features(i)
            assert features is None or not features.embeds.requires_grad
            torch.testing.assert_close(
                token_values(critic, batch, image_features=features), token_values(critic, batch)
            )
            passes.backward(i)


def test_a_micro_batch_that_ignores_its_images_still_lets_the_tower_train(tiny_qwen25: Path) -> None:
    actor = load_actor(tiny_qwen25)
    batches = micro_batches(actor, tiny_qwen25)[2:]
    passes = VisionPasses(actor, batches, group=2)
    passes.features(0)  # micro-batch 0's loss never uses its features: their gradient counts as zero
    passes.backward(0)
    actor_loss(actor, batches[1], passes.features(1)).backward()
    passes.backward(1)
    assert actor.model.visual.patch_embed.proj.weight.grad is not None


def test_group_must_be_positive(tiny_qwen25: Path) -> None:
    actor = load_actor(tiny_qwen25)
    with pytest.raises(ValueError, match="group must be >= 1"):
        VisionPasses(actor, [], group=0)


def test_features_must_match_the_image_pads(tiny_qwen25: Path) -> None:
    actor = load_actor(tiny_qwen25)
    batches = micro_batches(actor, tiny_qwen25)
    features = VisionPasses(actor, batches, group=1).features(0)
    assert features is not None
    short = ImageFeatures(features.embeds[:-1])
    with pytest.raises(ValueError, match="image pad tokens but"):
        actor_loss(actor, batches[0], short)


def test_image_features_come_joined_or_per_image(tiny_checkpoints: dict[str, Path]) -> None:
    """Transformers versions hand the tower's rows back one tensor per image or already joined (5.17's
    Qwen3-VL deepstack levels); `encode_images` gives the same features either way."""
    path = tiny_checkpoints["qwen3_vl"]
    backbone = load_actor(path).model
    batch = micro_batches(load_actor(path), path)[0]
    assert batch.pixel_values is not None
    per_image = encode_images(backbone, batch.pixel_values, batch.image_grid_thw)
    original = backbone.get_image_features

    def join(rows: torch.Tensor | list[torch.Tensor]) -> torch.Tensor:
        return rows if isinstance(rows, torch.Tensor) else torch.cat(rows)

    def joined(*args: object, **kwargs: object) -> object:
        out = original(*args, **kwargs)
        out.pooler_output = join(out.pooler_output)
        out.deepstack_features = [join(level) for level in out.deepstack_features]
        return out

    backbone.get_image_features = joined
    together = encode_images(backbone, batch.pixel_values, batch.image_grid_thw)
    assert len(together.tensors) == len(per_image.tensors) > 1
    for a, b in zip(together.tensors, per_image.tensors, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
