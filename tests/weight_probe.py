"""Checks of a weight sync for the tests: does the engine now score like the trainer?

`verify_weight_sync` greedy-generates from a probe with the engine, scores the same ids with the
trainer's model, and compares logprobs; `nudge` moves a model's weights so that a missed sync shows.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from PIL import Image
from transformers import PreTrainedModel

from vistarl.clients.images import encode_image
from vistarl.trainer.learner.logprobs import sequence_logprobs
from vistarl.trainer.learner.models import ActorModel
from vistarl.trainer.rollout.engines.base import Engine, GenerateRequest
from vistarl.trainer.rollout.engines.sglang_api import SamplingParams
from vistarl.trainer.rollout.processor import VLProcessor
from vistarl.trainer.rollout.tokenization import TurnEncoder

PROBE_QUESTIONS = (
    "Describe the picture in a few words.",
    "Which colour is in the top left corner?",
    "Count the stripes.",
)


class WeightSyncMismatch(AssertionError):
    """After a sync, the engine's logprobs differ from the trainer's by more than the tolerance."""


def nudge(model: torch.nn.Module, amount: float = 0.02, seed: int = 1) -> dict[str, torch.Tensor]:
    """Add small seeded noise to every parameter (tied ones once); returns the new state dict."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(amount * torch.randn(parameter.shape, generator=generator))
    return model.state_dict()


def probe_messages(question: str = PROBE_QUESTIONS[0]) -> list[dict[str, Any]]:
    """A system prompt and a user turn with one small image: the probe a sync check generates from."""
    image = Image.new("RGB", (56, 56))
    for x in range(56):
        for y in range(56):
            image.putpixel((x, y), (4 * x, 4 * y, 128))
    return [
        {"role": "system", "content": "You check weight synchronisation."},
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": encode_image(image)}},
                {"type": "text", "text": question},
            ],
        },
    ]


async def verify_weight_sync(
    engine: Engine,
    model: ActorModel | PreTrainedModel,
    processor: VLProcessor,
    *,
    messages: Sequence[Mapping[str, Any]] | None = None,
    max_new_tokens: int = 8,
    tolerance: float = 1e-3,
) -> float:
    """Greedy-generate from a probe with `engine`, score the same ids with `model`, and compare logprobs.

    Returns the largest |engine − trainer| logprob difference over the generated tokens; raises
    `WeightSyncMismatch` when it exceeds `tolerance` (fp32 engines agree to ~1e-5, bf16 to ~1e-1).
    """
    prompt = TurnEncoder(processor).prompt(list(messages or probe_messages()))
    request = GenerateRequest(
        engine_ids=prompt.ids,
        images=prompt.images,
        sampling=SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, ignore_eos=True),
    )
    result = await engine.generate(request)
    if result.aborted or not result.output_ids:
        raise WeightSyncMismatch(f"the engine produced no probe tokens: {result.finish_reason}")
    prompt_ids = processor.expand_image_pads(prompt.ids, prompt.grids)
    train_ids = prompt_ids + result.output_ids
    mask = [0] * len(prompt_ids) + [1] * len(result.output_ids)
    with torch.no_grad():
        trainer_logp = sequence_logprobs(model, processor, train_ids, prompt.images, 1.0, mask=mask)
    ours = trainer_logp[len(prompt_ids) :]
    theirs = torch.tensor(result.logprobs, dtype=ours.dtype)
    diff = float((ours - theirs).abs().max())
    if diff > tolerance:
        raise WeightSyncMismatch(
            f"engine (weight version {result.weight_version}) and trainer logprobs differ by up to "
            f"{diff:.3g} > {tolerance:g} on the probe"
        )
    return diff


async def verify_batch(
    engine: Engine, model: ActorModel | PreTrainedModel, processor: VLProcessor, tolerance: float
) -> float:
    """`verify_weight_sync` on every probe question at once, so the engine scores them as one batch;
    the largest difference."""
    checks = [
        verify_weight_sync(engine, model, processor, messages=probe_messages(q), tolerance=tolerance)
        for q in PROBE_QUESTIONS
    ]
    return max(await asyncio.gather(*checks))
