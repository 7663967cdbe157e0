"""Packed rows score like single sequences, attend only within a sequence; micro-batches are balanced."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.vl_samples import make_sample, mixed_samples
from vistarl.devtools.tiny_checkpoint import ARCHS
from vistarl.trainer.learner.logprobs import (
    chunked_logprobs,
    score_index,
    sequence_logprobs,
    token_logprobs,
    token_values,
)
from vistarl.trainer.learner.models import ActorModel, load_actor, load_critic
from vistarl.trainer.learner.packing import PackedBatch, SequenceSample, pack_sequences, plan_micro_batches
from vistarl.trainer.rollout.processor import VLProcessor

TEMPERATURE = 0.7


@pytest.fixture(scope="module", params=ARCHS)
def arch_setup(
    request: pytest.FixtureRequest, tiny_checkpoints: dict[str, Path]
) -> tuple[ActorModel, VLProcessor, Path]:
    """The tiny actor (eval mode) and processor of each architecture."""
    path = tiny_checkpoints[request.param]
    return load_actor(path).eval(), VLProcessor.from_pretrained(path), path


def packed(
    actor: ActorModel, processor: VLProcessor, samples: list[SequenceSample], dummy_image: bool = True
) -> PackedBatch:
    return pack_sequences(samples, processor, actor.model.get_rope_index, dummy_image=dummy_image)


def test_packed_logprobs_equal_unpacked(arch_setup: tuple[ActorModel, VLProcessor, Path]) -> None:
    actor, processor, _ = arch_setup
    samples = mixed_samples(processor)
    batch = packed(actor, processor, samples)
    assert (
        batch.cu_seqlens.numel() - 1 == 3
        and batch.image_grid_thw is not None
        and len(batch.image_grid_thw) == 3
    )
    pads = batch.input_ids[0] == processor.ids.image_pad
    assert batch.image_positions.tolist() == pads.nonzero().squeeze(-1).tolist() and pads.sum() > 0
    with torch.no_grad():
        together = token_logprobs(actor, batch, TEMPERATURE).logprobs
        alone = torch.cat(
            [
                sequence_logprobs(actor, processor, s.train_ids, s.images, TEMPERATURE, mask=s.loss_mask)
                for s in samples
            ]
        )
    scored = batch.loss_mask.bool()
    assert torch.all(together[~scored] == 0)
    assert torch.all(together[scored] < 0)
    torch.testing.assert_close(together, alone, rtol=0, atol=1e-5)


def test_omitting_text_positions_leaks_attention(arch_setup: tuple[ActorModel, VLProcessor, Path]) -> None:
    """The control: with only the three mRoPE rows, later sequences see earlier ones."""
    actor, processor, _ = arch_setup
    batch = packed(actor, processor, mixed_samples(processor))
    index = score_index(batch)
    score = functools.partial(chunked_logprobs, temperature=TEMPERATURE, chunk_size=64, with_entropy=False)
    with torch.no_grad():
        right = token_logprobs(actor, batch, TEMPERATURE).logprobs[index]
        leaky = actor(
            index,
            score,
            input_ids=batch.input_ids,
            position_ids=batch.position_ids[1:],
            pixel_values=batch.pixel_values,
            image_grid_thw=batch.image_grid_thw,
        ).logprobs
    first_end = int(batch.cu_seqlens[1])
    in_first = index < first_end
    torch.testing.assert_close(leaky[in_first], right[in_first], rtol=0, atol=1e-5)
    assert (leaky[~in_first] - right[~in_first]).abs().max() > 1e-2


def test_packed_values_equal_unpacked(arch_setup: tuple[ActorModel, VLProcessor, Path]) -> None:
    actor, processor, path = arch_setup
    critic = load_critic(path).eval()
    torch.nn.init.normal_(critic.value_head.weight, std=0.5, generator=torch.Generator().manual_seed(0))
    samples = mixed_samples(processor)
    with torch.no_grad():
        together = token_values(critic, packed(actor, processor, samples))
        alone = torch.cat([token_values(critic, packed(actor, processor, [s], False)) for s in samples])
    assert together.abs().max() > 0
    torch.testing.assert_close(together, alone, rtol=0, atol=1e-5)


def test_text_only_batch_runs_vision_tower_with_zero_gradient(
    arch_setup: tuple[ActorModel, VLProcessor, Path],
) -> None:
    actor, processor, path = arch_setup
    actor = load_actor(path)
    rng = np.random.default_rng(1)
    batch = packed(actor, processor, [make_sample(processor, rng, 6, 9), make_sample(processor, rng, 3, 5)])
    assert batch.image_grid_thw is not None and batch.image_grid_thw.shape[0] == 1
    assert batch.num_tokens > int(batch.cu_seqlens[-1])  # the dummy segment follows the sequences
    scores = token_logprobs(actor, batch, TEMPERATURE)
    (-(scores.logprobs * batch.advantages).sum()).backward()
    vision = dict(actor.model.visual.named_parameters())
    assert vision and all(p.grad is not None and torch.all(p.grad == 0) for p in vision.values())
    text_grads = [p.grad for p in actor.model.language_model.layers.parameters()]
    assert all(g is not None for g in text_grads) and any(
        g.abs().sum() > 0 for g in text_grads if g is not None
    )


def test_empty_micro_batch_still_backpropagates(arch_setup: tuple[ActorModel, VLProcessor, Path]) -> None:
    """A rank with fewer sequences than micro-batches packs the dummy segment alone and still steps."""
    actor, processor, path = arch_setup
    actor = load_actor(path)
    batch = packed(actor, processor, [])
    assert batch.cu_seqlens.numel() - 1 == 0 and batch.num_tokens > 0
    scores = token_logprobs(actor, batch, TEMPERATURE)
    assert scores.logprobs.abs().sum() == 0
    scores.logprobs.sum().backward()
    assert all(p.grad is not None for p in actor.parameters())


def test_bad_samples_are_rejected(arch_setup: tuple[ActorModel, VLProcessor, Path]) -> None:
    actor, processor, _ = arch_setup
    sample = mixed_samples(processor)[0]
    short_mask = SequenceSample(sample.train_ids, sample.loss_mask[:-1], sample.images)
    with pytest.raises(ValueError, match="loss_mask has"):
        packed(actor, processor, [short_mask])
    missing_image = SequenceSample(sample.train_ids, sample.loss_mask, [])
    with pytest.raises(ValueError, match="runs of image pads for 0 images"):
        packed(actor, processor, [missing_image])
    pads = processor.ids.image_pad
    one_pad_less = list(sample.train_ids)
    one_pad_less.remove(pads)
    trimmed = SequenceSample(one_pad_less, sample.loss_mask[1:], sample.images)
    with pytest.raises(ValueError, match="pad tokens, but its grid"):
        packed(actor, processor, [trimmed])


def test_positions_are_the_models_once_a_layout(arch_setup: tuple[ActorModel, VLProcessor, Path]) -> None:
    """Sequences of one layout up to the token after their last image (a group's replies of any length) take
    the model's mRoPE rows from one `get_rope_index` call, and every row equals the model's own for it:
    text after an image, a sequence that ends on its image, several images and none."""
    actor, processor, _ = arch_setup
    rng = np.random.default_rng(1)
    shared = make_sample(processor, rng, 7, 3, [(56, 84)])
    prompt = len(shared.train_ids) - 3
    group = [
        SequenceSample([*shared.train_ids[:prompt], *range(1, n + 1)], [0] * prompt + [1] * n, shared.images)
        for n in (1, 3, 9)
    ]
    ends_on_image = SequenceSample(shared.train_ids[: prompt - 7 - 1], [0] * (prompt - 8), shared.images)
    samples = [*group, ends_on_image, *mixed_samples(processor)]
    calls: list[int] = []

    def rope_index(ids: torch.Tensor, **kwargs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        calls.append(ids.shape[1])
        return actor.model.get_rope_index(ids, **kwargs)

    batch = pack_sequences(samples, processor, rope_index)
    assert len(calls) == 1 + 1 + 3  # the group, the one ending on its image, the mixed three (no dummy)
    bounds = batch.attention_bounds.tolist()
    starts = [0, *np.cumsum([len(s.images) for s in samples]).tolist()]
    for k, sample in enumerate(samples):
        ids = torch.tensor(sample.train_ids)[None, :]
        grids = batch.image_grid_thw[starts[k] : starts[k + 1]]
        own, _ = actor.model.get_rope_index(
            ids,
            mm_token_type_ids=(ids == processor.ids.image_pad).int(),
            image_grid_thw=grids if len(grids) else None,
        )
        assert torch.equal(batch.position_ids[1:, :, bounds[k] : bounds[k + 1]], own)
        text = batch.position_ids[0, 0, bounds[k] : bounds[k + 1]]
        assert text.tolist() == list(range(len(sample.train_ids)))


def test_padded_round_trip(arch_setup: tuple[ActorModel, VLProcessor, Path]) -> None:
    actor, processor, _ = arch_setup
    batch = packed(actor, processor, mixed_samples(processor)[1:2])  # text only: a dummy segment follows
    values = torch.arange(batch.num_tokens, dtype=torch.float32) * (batch.loss_mask + 1)
    padded = batch.to_padded(values)
    assert padded.shape == (1, int(batch.cu_seqlens[-1]))
    torch.testing.assert_close(padded[0], values[: int(batch.cu_seqlens[-1])])


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 100), max_size=40),
    num_ranks=st.integers(1, 8),
    budget=st.integers(100, 400),
)
def test_plan_is_balanced_and_complete(lengths: list[int], num_ranks: int, budget: int) -> None:
    plan = plan_micro_batches(lengths, num_ranks, budget)
    assert len(plan) == num_ranks
    assert len({len(rank) for rank in plan}) == 1
    placed = sorted(i for rank in plan for micro in rank for i in micro)
    assert placed == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in micro) <= budget for rank in plan for micro in rank)
    assert plan == plan_micro_batches(lengths, num_ranks, budget)


def test_plan_uses_few_micro_batches_and_balances_ranks() -> None:
    lengths = [50] * 16
    plan = plan_micro_batches(lengths, num_ranks=4, micro_batch_tokens=100)
    assert [len(rank) for rank in plan] == [2, 2, 2, 2]
    assert {sum(lengths[i] for i in micro) for rank in plan for micro in rank} == {100}
    uneven = [90, 80, 70, 60, 50, 40, 30, 20, 10]
    loads = [[sum(uneven[i] for i in micro) for micro in rank] for rank in plan_micro_batches(uneven, 2, 200)]
    rank_totals = [sum(rank) for rank in loads]
    assert max(rank_totals) - min(rank_totals) <= 30


def test_plan_rejects_sequences_over_budget() -> None:
    with pytest.raises(ValueError, match="sequence 1 has 300 tokens"):
        plan_micro_batches([10, 300], num_ranks=2, micro_batch_tokens=256)
