"""Recompute token logprobs, entropies and values over packed rows: the one recompute path.

The trainer's old / reference / new logprobs and the rollout's parity check all go through
`token_logprobs`. Only the scored tokens (the loss mask, or any mask given) reach `lm_head`: the
backbone yields hidden states, position i-1 of which scores token i, and `lm_head` + log-softmax run
over them in chunks, so `[T, V]` logits (V ≈ 152k) never exist. With gradients on, each chunk is
checkpointed, so backward holds one chunk's logits at a time too. Logits are divided by the rollout
temperature before the softmax, as the engine samples.

Results are `[T]` tensors aligned with the row's tokens, 0 where nothing was scored, matching
`loss_mask` and `rollout_logprobs`. Gradients flow when enabled; wrap in `torch.no_grad()` for old
and reference logprobs. `compiled=True` runs each chunk's softmax work as a few fused kernels
(`torch.compile`) instead of one pass over the `[chunk, V]` logits per elementwise op.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import NamedTuple, cast

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import PreTrainedModel

from vistarl.trainer.learner.models import ActorModel
from vistarl.trainer.learner.packing import PackedBatch, SequenceSample, pack_sequences, scored_positions
from vistarl.trainer.modeling.image_features import ImageFeatures
from vistarl.trainer.rollout.processor import ImageLike, VLProcessor

DEFAULT_CHUNK_SIZE = 1024


class TokenScores(NamedTuple):
    """Per-token logprobs, and entropies when asked for, both float32 and 0 where nothing was scored."""

    logprobs: torch.Tensor
    entropy: torch.Tensor | None


def token_logprobs(
    actor: nn.Module,
    batch: PackedBatch,
    temperature: float,
    *,
    mask: torch.Tensor | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    with_entropy: bool = False,
    compiled: bool = False,
    image_features: ImageFeatures | None = None,
) -> TokenScores:
    """Logprob of each token where `mask` (default: `batch.loss_mask`) is 1, given its sequence's prefix.

    `actor` is an `ActorModel`, plain or FSDP-sharded. `image_features`: the batch's images already
    encoded (`vistarl.trainer.learner.vision_passes`); without them the actor runs its vision tower on the
    batch's.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    index = score_index(batch, mask)
    score = functools.partial(
        chunked_logprobs,
        temperature=temperature,
        chunk_size=chunk_size,
        with_entropy=with_entropy,
        compiled=compiled,
    )
    scores: TokenScores = actor(
        **batch.forward_inputs(), index=index, score=score, image_features=image_features
    )
    entropy = _scatter(scores.entropy, index, batch.num_tokens) if scores.entropy is not None else None
    return TokenScores(_scatter(scores.logprobs, index, batch.num_tokens), entropy)


def token_values(
    critic: nn.Module,
    batch: PackedBatch,
    *,
    mask: torch.Tensor | None = None,
    image_features: ImageFeatures | None = None,
) -> torch.Tensor:
    """The critic's value of the state before each token where `mask` (default: the loss mask) is 1;
    `image_features` as for `token_logprobs`."""
    index = score_index(batch, mask)
    values: torch.Tensor = critic(**batch.forward_inputs(), index=index, image_features=image_features)
    return _scatter(values, index, batch.num_tokens)


def sequence_logprobs(
    model: ActorModel | PreTrainedModel,
    processor: VLProcessor,
    train_ids: Sequence[int],
    images: Sequence[ImageLike],
    temperature: float,
    *,
    mask: Sequence[int] | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> torch.Tensor:
    """Logprobs `[L]` of one trajectory's `train_ids` (pads expanded, images in pad order) on CPU.

    Scores the tokens where `mask` is 1 (default: every token after the first). `model` is an
    `ActorModel` or the bare HF model an engine holds.
    """
    actor = model if isinstance(model, ActorModel) else ActorModel.from_lm(model)
    mask = mask if mask is not None else [0] + [1] * (len(train_ids) - 1)
    sample = SequenceSample(train_ids=train_ids, loss_mask=mask, images=images)
    batch = pack_sequences([sample], processor, actor.model.get_rope_index, dummy_image=False)
    device = next(actor.parameters()).device
    logprobs = token_logprobs(actor, batch.to(device), temperature, chunk_size=chunk_size).logprobs
    return logprobs.cpu()


def chunked_logprobs(
    head: nn.Module,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    *,
    temperature: float,
    chunk_size: int,
    with_entropy: bool,
    compiled: bool = False,
) -> TokenScores:
    """`log softmax(head(hidden) / temperature)[targets]` (`[K]`), `chunk_size` rows of logits at a time."""
    chunk_scores = _compiled_chunk_scores() if compiled else _chunk_scores
    run = functools.partial(chunk_scores, head, temperature=temperature, with_entropy=with_entropy)
    pieces: list[torch.Tensor] = [
        checkpoint(run, h, t, use_reentrant=False) if torch.is_grad_enabled() else run(h, t)
        for h, t in zip(hidden.split(chunk_size), targets.split(chunk_size), strict=True)
    ]
    logprobs = torch.cat([piece[:, 0] for piece in pieces])  # new tensors, not views: FSDP hooks outputs
    return TokenScores(logprobs, torch.cat([piece[:, 1] for piece in pieces]) if with_entropy else None)


def _chunk_scores(
    head: nn.Module, hidden: torch.Tensor, targets: torch.Tensor, *, temperature: float, with_entropy: bool
) -> torch.Tensor:
    """`[C, 1]` target logprobs of one chunk, or `[C, 2]` with the entropies, in float32."""
    logits = head(hidden).float() / temperature
    log_norm = torch.logsumexp(logits, dim=-1)
    logprobs = logits.gather(-1, targets[:, None]).squeeze(-1) - log_norm
    if not with_entropy:
        return logprobs[:, None]
    entropy = log_norm - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    return torch.stack([logprobs, entropy], dim=-1)


@functools.cache
def _compiled_chunk_scores() -> Callable[..., torch.Tensor]:
    """`_chunk_scores` compiled once per process, for chunks of any length."""
    return cast(Callable[..., torch.Tensor], torch.compile(_chunk_scores, dynamic=True))


def score_index(batch: PackedBatch, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Positions of the tokens to score: the batch's own (found when it was packed) unless `mask` says
    otherwise; a sequence's first token has no prefix, so it cannot be one."""
    if mask is None:
        return batch.scored
    if mask.shape != (batch.num_tokens,):
        raise ValueError(f"mask has shape {tuple(mask.shape)}, expected ({batch.num_tokens},)")
    return scored_positions(mask.cpu(), batch.cu_seqlens).to(batch.input_ids.device)


def _scatter(values: torch.Tensor, index: torch.Tensor, length: int) -> torch.Tensor:
    """`[K]` values at `index` in a zero `[length]` tensor (differentiable)."""
    return values.new_zeros(length).index_copy(0, index, values)
