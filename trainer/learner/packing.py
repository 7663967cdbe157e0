"""Pack token sequences into one row for a Qwen-VL forward pass, and plan balanced micro-batches.

A packed row holds several sequences back to back with no padding. Its `position_ids` have four
rows (docs/fsdp.md): row 0 is each sequence's text position, restarting at 0, which transformers
reads to keep attention inside each sequence; rows 1-3 are the mRoPE t/h/w positions, from the model's
own `get_rope_index`. Those depend only on where a sequence's image pads lie and on the images' grids,
and text after the last image goes on one position a token, so the model computes them once per layout
of a batch up to the token after its last image (the samples of a GRPO group share one), and the rest is
a count. Images of all sequences are concatenated in pad order, into pinned memory when the batch is
bound for a GPU (one copy, not a concatenation and then a pinned copy of it).

Everything the forward needs to know about the layout is computed here, on the host, so the GPU step
never waits on a host-device sync to learn it: the attention bounds of every segment, the longest
one, and the scored positions. `cu_seqlens` and `image_grid_thw` stay on the host when the rest of
the batch moves to the GPU (the vision tower's own inputs are derived from the grid there too,
`vistarl.trainer.modeling.vision_inputs`).

Under FSDP every rank must run the vision tower in every micro-batch, or the collectives of ranks
with and without images stop matching. A row without images therefore ends in a dummy segment
`<|vision_start|><|image_pad|>…<|vision_end|>` with one tiny black image: the vision parameters
enter the graph through the model's normal path, and since no other token attends to the segment and
none of its tokens is scored, their gradient is exactly zero.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np
import torch
from PIL import Image

from vistarl.trainer.modeling.attention import SequenceBounds
from vistarl.trainer.modeling.device import host_to_device
from vistarl.trainer.rollout.processor import ImageLike, VLProcessor, concat_pixels

RopeIndex = Callable[..., tuple[torch.Tensor, torch.Tensor]]
"""The model's `get_rope_index(input_ids, mm_token_type_ids=..., image_grid_thw=...)`."""
Layout = tuple[int, tuple[int, ...], tuple[int, ...], tuple[tuple[int, ...], ...]]
"""What a sequence's mRoPE rows up to the token after its last image depend on: that length, the starts
and ends of its image-pad runs, and its images' grids."""


@dataclass(frozen=True)
class SequenceSample:
    """One sequence to pack: the trainer's token track with its per-token data, images in pad order."""

    train_ids: Sequence[int]
    loss_mask: Sequence[int]
    images: Sequence[ImageLike] = ()
    rollout_logprobs: Sequence[float] | None = None
    advantages: Sequence[float] | None = None


HOST_FIELDS = frozenset({"cu_seqlens", "image_grid_thw"})
"""Fields that `PackedBatch.to` leaves on the host: reading them never waits for the GPU."""


@dataclass(frozen=True)
class PackedBatch:
    """Sequences packed into one row; tokens from `cu_seqlens[-1]` on belong to the dummy-image segment."""

    input_ids: torch.Tensor  # [1, T] int64
    position_ids: torch.Tensor  # [4, 1, T] int64: text positions, then mRoPE t/h/w
    pixel_values: torch.Tensor | None  # [patches, C·t·p·p]
    image_grid_thw: torch.Tensor | None  # [images, 3] int64, on the host
    loss_mask: torch.Tensor  # [T] float32, 1 on scored (generated) tokens
    rollout_logprobs: torch.Tensor  # [T] float32, 0 where unknown
    advantages: torch.Tensor  # [T] float32, 0 until the trainer fills it
    cu_seqlens: torch.Tensor  # [S + 1] int64, sequence boundaries, on the host
    attention_bounds: torch.Tensor  # [segments + 1] int32: every segment's bounds, the dummy's too
    longest: int  # tokens in the longest segment
    scored: torch.Tensor  # [K] int64: positions where loss_mask is 1
    image_positions: torch.Tensor  # [P] int64: positions of the image pad tokens, in image order

    @property
    def num_tokens(self) -> int:
        """Tokens in the row, the dummy segment included."""
        return int(self.input_ids.shape[1])

    def to(self, device: torch.device | str) -> PackedBatch:
        """The same batch with every tensor but the `HOST_FIELDS` on `device`, copied to a GPU through
        pinned memory (`host_to_device`): a copy from pageable memory would wait for the GPU's queued work."""
        target = torch.device(device)
        moved: dict[str, Any] = {
            f.name: host_to_device(value, target)
            for f in fields(self)
            if f.name not in HOST_FIELDS and isinstance(value := getattr(self, f.name), torch.Tensor)
        }
        return replace(self, **moved)

    def model_inputs(self) -> dict[str, torch.Tensor | None]:
        """The keyword arguments of a VL backbone forward over this row."""
        return {
            "input_ids": self.input_ids,
            "position_ids": self.position_ids,
            "pixel_values": self.pixel_values,
            "image_grid_thw": self.image_grid_thw,
        }

    def forward_inputs(self) -> dict[str, Any]:
        """The keyword arguments of an actor or critic forward over this row: `model_inputs`, with the
        image grid as host ints (FSDP moves every tensor argument to the GPU), the sequence bounds and
        the image positions."""
        grid = self.image_grid_thw.tolist() if self.image_grid_thw is not None else None
        return {
            **self.model_inputs(),
            "image_grid_thw": grid,
            "bounds": self.bounds,
            "image_positions": self.image_positions,
        }

    @property
    def bounds(self) -> SequenceBounds:
        """Where each segment's attention starts and ends, for the packed forward."""
        return SequenceBounds(self.attention_bounds, self.longest)

    def to_padded(self, values: torch.Tensor, pad: float = 0.0) -> torch.Tensor:
        """Per-token `[T]` values as a right-padded `[S, max_len]` tensor, one row per sequence."""
        lengths = self.cu_seqlens.diff().tolist()
        pieces = values[: int(self.cu_seqlens[-1])].split(lengths)
        return torch.nn.utils.rnn.pad_sequence(list(pieces), batch_first=True, padding_value=pad)


def pack_sequences(
    samples: Sequence[SequenceSample],
    processor: VLProcessor,
    rope_index: RopeIndex,
    *,
    dummy_image: bool = True,
    pin_memory: bool = False,
) -> PackedBatch:
    """Pack `samples` into one row (see the module docstring); an empty list packs to the dummy only.

    `dummy_image=False` skips the dummy segment, for single-process passes that need no collectives;
    `pin_memory=True` puts the pixels in pinned memory, for a batch bound for a GPU.
    """
    for i, sample in enumerate(samples):
        _check_lengths(i, sample)
    segments = list(samples)
    has_images = any(sample.images for sample in samples)
    if dummy_image and not has_images:
        segments.append(dummy_image_sample(processor))
    if not segments:
        raise ValueError("nothing to pack: no sequences and no dummy image")
    images = [image for sample in segments for image in sample.images]
    pixels = concat_pixels(processor.image_inputs(images), pin_memory) if images else None
    grids = pixels.image_grid_thw.tolist() if pixels is not None else []
    starts = [0, *itertools.accumulate(len(sample.images) for sample in segments)]
    layouts: dict[Layout, np.ndarray] = {}
    positions = [
        _sequence_positions(i, sample, grids[starts[i] : starts[i + 1]], processor, rope_index, layouts)
        for i, sample in enumerate(segments)
    ]
    lengths = [len(sample.train_ids) for sample in samples]
    segment_lengths = [len(sample.train_ids) for sample in segments]
    loss_mask = _per_token(segments, lambda s: s.loss_mask)
    cu_seqlens = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.long)
    flat_ids = np.fromiter((t for s in segments for t in s.train_ids), dtype=np.int64)
    input_ids = torch.from_numpy(flat_ids)[None, :]
    return PackedBatch(
        input_ids=input_ids,
        position_ids=torch.from_numpy(np.concatenate(positions, axis=1)).unsqueeze(1),
        pixel_values=pixels.pixel_values if pixels is not None else None,
        image_grid_thw=pixels.image_grid_thw if pixels is not None else None,
        loss_mask=loss_mask,
        rollout_logprobs=_per_token(segments, lambda s: s.rollout_logprobs),
        advantages=_per_token(segments, lambda s: s.advantages),
        cu_seqlens=cu_seqlens,
        attention_bounds=torch.tensor([0, *itertools.accumulate(segment_lengths)], dtype=torch.int32),
        longest=max(segment_lengths),
        scored=scored_positions(loss_mask, cu_seqlens),
        image_positions=torch.from_numpy(np.flatnonzero(flat_ids == processor.ids.image_pad)),
    )


def scored_positions(mask: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Positions where `mask` is 1 (`[T]`, on the host); each needs a prefix in its own sequence, so the
    first token of a sequence, or one of the dummy segment after `cu_seqlens[-1]`, is an error. Found in
    numpy: torch's host `nonzero` costs milliseconds on a long row."""
    index = torch.from_numpy(np.flatnonzero(mask.numpy()))
    starts = cu_seqlens[:-1]
    if torch.isin(index, starts).any():
        first = index[torch.isin(index, starts)][0].item()
        raise ValueError(f"token {first} starts its sequence: it has no prefix to be scored from")
    if index.numel() and index[-1] >= cu_seqlens[-1]:
        raise ValueError("the mask selects tokens of the dummy-image segment, which no sequence owns")
    return index


def dummy_image_sample(processor: VLProcessor) -> SequenceSample:
    """A sequence holding one smallest-size black image and nothing to score."""
    side = processor.patch_size * processor.merge_size
    image = Image.new("RGB", (side, side))
    pads = processor.num_image_tokens(processor.image_grid(image))
    ids = processor.ids
    train_ids = [ids.vision_start, *[ids.image_pad] * pads, ids.vision_end]
    return SequenceSample(train_ids=train_ids, loss_mask=[0] * len(train_ids), images=[image])


def _check_lengths(index: int, sample: SequenceSample) -> None:
    """Every per-token list of a sample has one entry per token, and the sample is not empty."""
    n = len(sample.train_ids)
    if n == 0:
        raise ValueError(f"sequence {index} has no tokens")
    per_token = {
        "loss_mask": sample.loss_mask,
        "rollout_logprobs": sample.rollout_logprobs,
        "advantages": sample.advantages,
    }
    for name, values in per_token.items():
        if values is not None and len(values) != n:
            raise ValueError(f"sequence {index}: {name} has {len(values)} entries for {n} tokens")


def _sequence_positions(
    index: int,
    sample: SequenceSample,
    grids: list[list[int]],
    processor: VLProcessor,
    rope_index: RopeIndex,
    layouts: dict[Layout, np.ndarray],
) -> np.ndarray:
    """The `[4, L]` position ids of one sequence: text positions, then the model's mRoPE rows, which
    `layouts` keeps by `Layout` up to the token after the last image; past it they count on by one."""
    ids = np.asarray(sample.train_ids, dtype=np.int64)
    is_pad = ids == processor.ids.image_pad
    edges = np.flatnonzero(np.diff(is_pad, prepend=False, append=False)).tolist()
    starts, ends = edges[0::2], edges[1::2]
    if len(starts) != len(grids):
        raise ValueError(f"sequence {index}: {len(starts)} runs of image pads for {len(grids)} images")
    for k, (start, end, grid) in enumerate(zip(starts, ends, grids, strict=True)):
        expected = processor.num_image_tokens(grid)
        if (run := end - start) != expected:
            raise ValueError(
                f"sequence {index}: image {k} has {run} pad tokens, but its grid {grid} needs {expected}"
            )
    head = min(len(ids), ends[-1] + 1) if ends else 1
    layout = (head, tuple(starts), tuple(ends), tuple(tuple(grid) for grid in grids))
    mrope = layouts.get(layout)
    if mrope is None:
        rows, _ = rope_index(
            torch.from_numpy(ids[None, :head]),
            mm_token_type_ids=torch.from_numpy(is_pad[None, :head].astype(np.int32)),
            image_grid_thw=torch.tensor(grids, dtype=torch.long) if grids else None,
        )
        mrope = layouts[layout] = rows[:, 0].to(torch.long).numpy()
    tail = mrope[:, -1:] + np.arange(1, len(ids) - head + 1)
    return np.vstack([np.arange(len(ids)), np.hstack([mrope, tail])])


def _per_token(
    segments: Sequence[SequenceSample],
    values: Callable[[SequenceSample], Sequence[float] | Sequence[int] | None],
) -> torch.Tensor:
    """One float32 `[T]` tensor from a per-token field of every segment; missing fields are zeros."""
    flat: list[float] = []
    for segment in segments:
        field_values = values(segment)
        flat.extend(field_values if field_values is not None else [0.0] * len(segment.train_ids))
    return torch.tensor(flat, dtype=torch.float32)


def plan_micro_batches(
    lengths: Sequence[int], num_ranks: int, micro_batch_tokens: int
) -> list[list[list[int]]]:
    """Split sequences (by index) into `num_ranks` lists with the same number of micro-batches each.

    No micro-batch holds more than `micro_batch_tokens` tokens. Sequences go longest first into the
    least-loaded of `num_ranks · m` bins, with `m` the smallest count for which they all fit; bins are
    then dealt to ranks in snake order by load, so micro-batch j carries similar work on every rank
    (they step in lockstep). Deterministic; a rank may get empty micro-batches when sequences are few.
    """
    if num_ranks < 1 or micro_batch_tokens < 1:
        raise ValueError(
            f"need num_ranks >= 1 and micro_batch_tokens >= 1, got {num_ranks}, {micro_batch_tokens}"
        )
    for i, length in enumerate(lengths):
        if not 1 <= length <= micro_batch_tokens:
            raise ValueError(f"sequence {i} has {length} tokens; each needs 1..{micro_batch_tokens}")
    per_rank = max(1, math.ceil(sum(lengths) / (num_ranks * micro_batch_tokens)))
    while (bins := _fill_bins(lengths, num_ranks * per_rank, micro_batch_tokens)) is None:
        per_rank += 1
    by_load = sorted(range(len(bins)), key=lambda b: (-sum(lengths[i] for i in bins[b]), b))
    plan: list[list[list[int]]] = [[] for _ in range(num_ranks)]
    for round_start in range(0, len(by_load), num_ranks):
        dealt = by_load[round_start : round_start + num_ranks]
        ranks = range(num_ranks) if (round_start // num_ranks) % 2 == 0 else reversed(range(num_ranks))
        for rank, b in zip(ranks, dealt, strict=True):
            plan[rank].append(sorted(bins[b]))
    return plan


def _fill_bins(lengths: Sequence[int], num_bins: int, capacity: int) -> list[list[int]] | None:
    """Longest-first into the least-loaded bin; None when a sequence fits in no bin."""
    heap = [(0, b) for b in range(num_bins)]
    bins: list[list[int]] = [[] for _ in range(num_bins)]
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        load, b = heapq.heappop(heap)
        if load + lengths[i] > capacity:
            return None
        bins[b].append(i)
        heapq.heappush(heap, (load + lengths[i], b))
    return bins
