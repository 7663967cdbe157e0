"""The recompute path: chunked logprobs equal a full log-softmax, in value and in gradient."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import PreTrainedModel

from tests.vl_samples import mixed_samples
from vistarl.devtools.tiny_checkpoint import ARCHS
from vistarl.trainer.learner.logprobs import sequence_logprobs, token_logprobs
from vistarl.trainer.learner.models import ActorModel, load_lm
from vistarl.trainer.learner.packing import PackedBatch, pack_sequences
from vistarl.trainer.rollout.processor import VLProcessor

TEMPERATURE = 0.6


@pytest.fixture(scope="module", params=ARCHS)
def lm_setup(
    request: pytest.FixtureRequest, tiny_checkpoints: dict[str, Path]
) -> tuple[PreTrainedModel, VLProcessor]:
    """The bare HF model (train mode) and processor of each tiny architecture."""
    path = tiny_checkpoints[request.param]
    return load_lm(path).train(), VLProcessor.from_pretrained(path)


def packed_batch(lm: PreTrainedModel, processor: VLProcessor) -> PackedBatch:
    return pack_sequences(mixed_samples(processor), processor, lm.model.get_rope_index)


def naive_scores(lm: PreTrainedModel, batch: PackedBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Logprobs and entropies at the loss mask from the model's full `[T, V]` logits."""
    logits = lm(**batch.model_inputs(), use_cache=False).logits[0] / TEMPERATURE
    logp = torch.log_softmax(logits.float(), dim=-1)
    token_logp = torch.zeros(batch.num_tokens)
    token_logp[1:] = logp[:-1].gather(-1, batch.input_ids[0, 1:, None]).squeeze(-1)
    entropy = torch.zeros(batch.num_tokens)
    entropy[1:] = -(logp.exp() * logp).sum(-1)[:-1]
    mask = batch.loss_mask
    return token_logp * mask, entropy * mask


def test_chunked_equals_full_log_softmax(lm_setup: tuple[PreTrainedModel, VLProcessor]) -> None:
    lm, processor = lm_setup
    batch = packed_batch(lm, processor)
    actor = ActorModel.from_lm(lm)
    with torch.no_grad():
        logp, entropy = naive_scores(lm, batch)
        for chunk_size in (16, 4096):
            scores = token_logprobs(actor, batch, TEMPERATURE, chunk_size=chunk_size, with_entropy=True)
            assert scores.entropy is not None and scores.logprobs.grad_fn is None
            torch.testing.assert_close(scores.logprobs, logp, rtol=0, atol=1e-5)
            torch.testing.assert_close(scores.entropy, entropy, rtol=1e-5, atol=1e-5)
    assert (
        entropy[batch.loss_mask.bool()].min() > 1.0
    )  # a near-uniform random model: the check is not vacuous


def test_chunked_gradients_equal_full(tiny_qwen25: Path) -> None:
    """Checkpointed chunks give the gradients of the plain graph, for the policy and entropy terms."""
    lm, processor = load_lm(tiny_qwen25).train(), VLProcessor.from_pretrained(tiny_qwen25)
    batch = pack_sequences(mixed_samples(processor)[:2], processor, lm.model.get_rope_index)
    weights = torch.linspace(-1, 1, batch.num_tokens)

    def grads(loss: torch.Tensor) -> list[torch.Tensor]:
        lm.zero_grad(set_to_none=True)
        loss.backward()
        return [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in lm.parameters()]

    logp, entropy = naive_scores(lm, batch)
    expected = grads((weights * logp).sum() + 0.1 * entropy.sum())
    scores = token_logprobs(ActorModel.from_lm(lm), batch, TEMPERATURE, chunk_size=16, with_entropy=True)
    assert scores.entropy is not None and scores.logprobs.requires_grad
    actual = grads((weights * scores.logprobs).sum() + 0.1 * scores.entropy.sum())
    assert any(g.abs().sum() > 0 for g in expected)
    for a, e in zip(actual, expected, strict=True):
        assert (a - e).norm() <= 1e-4 * e.norm() + 1e-7


def test_sequence_logprobs_from_the_bare_hf_model(lm_setup: tuple[PreTrainedModel, VLProcessor]) -> None:
    """What an engine's parity check calls: its HF model, one trajectory's ids, images and mask."""
    lm, processor = lm_setup
    sample = mixed_samples(processor)[2]
    batch = pack_sequences([sample], processor, lm.model.get_rope_index, dummy_image=False)
    with torch.no_grad():
        masked = sequence_logprobs(
            lm, processor, sample.train_ids, sample.images, TEMPERATURE, mask=sample.loss_mask
        )
        every = sequence_logprobs(lm, processor, sample.train_ids, sample.images, TEMPERATURE)
        expected, _ = naive_scores(lm, batch)
    torch.testing.assert_close(masked, expected, rtol=0, atol=1e-5)
    assert every[0] == 0 and torch.all(every[1:] < 0)
    torch.testing.assert_close(every * batch.loss_mask, masked, rtol=0, atol=1e-6)


def test_bad_requests_are_rejected(lm_setup: tuple[PreTrainedModel, VLProcessor]) -> None:
    lm, processor = lm_setup
    batch = packed_batch(lm, processor)
    actor = ActorModel.from_lm(lm)
    starts_a_sequence = torch.zeros(batch.num_tokens)
    starts_a_sequence[int(batch.cu_seqlens[1])] = 1
    with pytest.raises(ValueError, match="starts its sequence"):
        token_logprobs(actor, batch, 1.0, mask=starts_a_sequence)
    with pytest.raises(ValueError, match="mask has shape"):
        token_logprobs(actor, batch, 1.0, mask=torch.ones(3))
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(actor, batch, 0.0)
