"""`DynamicRows`, HF's eager decode: a DynamicCache grown by concatenation, its rows left-padded, a new
attention mask each step.

The engine decodes with it wherever it has no `StaticDecoder` (on the CPU unless `static_cache_len` is
set) and for a batch whose rows do not all fit one; the tests hold the static decoder's steps to it.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel

from vistarl.trainer.rollout.engines.hf.rows import Prefill, Ready, Step, stacked_positions, unpack_rows
from vistarl.trainer.rollout.engines.hf.sampling import RowSampling, SamplingRows, sample


@dataclass
class _LeftPadded:
    """The rows of a `DynamicRows` batch: their left-padded DynamicCache and mask, and next positions."""

    cache: Any
    attention_mask: torch.Tensor  # (rows, width), 0 on the left padding
    next_positions: torch.Tensor  # (rows,)

    @classmethod
    def of(cls, prefill: Prefill) -> _LeftPadded:
        """`prefill`'s packed rows, each right-aligned in a cache as wide as the longest prompt."""
        columns, valid = prefill.layout(int(prefill.lengths.max()), left=True)
        rows = [
            (unpack_rows(layer.keys, columns), unpack_rows(layer.values, columns))
            for layer in prefill.cache.layers
        ]
        return cls(DynamicCache(ddp_cache_data=rows), valid.long(), prefill.next_positions)


class DynamicRows:
    """HF's eager decode over a DynamicCache; new rows are left-padded into it."""

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model
        self.batch: _LeftPadded | None = None
        self.keys: list[Hashable] = []
        self.settings: list[RowSampling] = []
        self.sampling: SamplingRows | None = None
        self.index = torch.zeros(0, dtype=torch.long)
        self.last = torch.zeros(0, dtype=torch.long)

    @torch.inference_mode()
    def join(
        self, prefill: Prefill, keys: Sequence[Hashable], sampling: Sequence[RowSampling], first: torch.Tensor
    ) -> None:
        rows = _LeftPadded.of(prefill)
        self.batch = rows if self.batch is None else _merge(self.batch, rows)
        self.keys += keys
        self.settings += sampling
        self.sampling = SamplingRows.of(self.settings, first.device)
        self.index = torch.cat([self.index.to(first.device), torch.ones_like(first)])
        self.last = torch.cat([self.last.to(first.device), first])

    @torch.inference_mode()
    def keep(self, keys: Sequence[Hashable]) -> None:
        if list(keys) != self.keys:
            self._select([self.keys.index(key) for key in keys])

    @torch.inference_mode()
    def launch(self, keys: Sequence[Hashable]) -> Step:
        self.keep(keys)
        batch = self.batch
        assert batch is not None and self.sampling is not None, "launch before join"
        rows = len(keys)
        device = batch.attention_mask.device
        ones = torch.ones((rows, 1), dtype=batch.attention_mask.dtype, device=device)
        batch.attention_mask = torch.cat([batch.attention_mask, ones], dim=1)
        out = self.model(
            input_ids=self.last.view(rows, 1),
            attention_mask=batch.attention_mask,
            position_ids=batch.next_positions.view(1, rows, 1).expand(3, rows, 1),
            past_key_values=batch.cache,
            use_cache=True,
        )
        batch.next_positions = batch.next_positions + 1
        mode = max(setting.mode for setting in self.settings)
        tokens, logprobs = sample(out.logits[:, -1], self.sampling, self.index, mode)
        self.last, self.index = tokens, self.index + 1
        return Ready(tokens, logprobs)

    def prefix_of(self, key: Hashable, length: int) -> torch.Tensor:
        batch = self.batch
        assert batch is not None, "prefix_of before join"
        row = self.keys.index(key)
        start = batch.attention_mask.shape[1] - int(
            batch.attention_mask[row].sum()
        )  # its tokens, right-aligned
        return stacked_positions(batch.cache.layers, row, slice(start, start + length))

    def _select(self, rows: list[int]) -> None:
        """Keep only `rows` (indices into the current rows), in that order."""
        batch = self.batch
        assert batch is not None and self.sampling is not None
        index = torch.tensor(rows, dtype=torch.long, device=batch.attention_mask.device)
        batch.cache.batch_select_indices(index)
        batch.attention_mask = batch.attention_mask[index]
        batch.next_positions = batch.next_positions[index]
        self.keys = [self.keys[i] for i in rows]
        self.settings = [self.settings[i] for i in rows]
        self.sampling = SamplingRows.of(self.settings, index.device)
        self.index, self.last = self.index[index], self.last[index]

    def close(self) -> None:
        self.batch = None


@torch.inference_mode()
def _merge(batch: _LeftPadded, extra: _LeftPadded) -> _LeftPadded:
    """`batch` with `extra`'s rows appended: caches and attention masks left-padded to the longer one."""
    width = max(batch.attention_mask.shape[1], extra.attention_mask.shape[1])
    for layer, joining in zip(batch.cache.layers, extra.cache.layers, strict=True):
        layer.keys = torch.cat([_left_pad(layer.keys, width, 2), _left_pad(joining.keys, width, 2)])
        layer.values = torch.cat([_left_pad(layer.values, width, 2), _left_pad(joining.values, width, 2)])
    batch.attention_mask = torch.cat(
        [_left_pad(batch.attention_mask, width, 1), _left_pad(extra.attention_mask, width, 1)]
    )
    batch.next_positions = torch.cat([batch.next_positions, extra.next_positions])
    return batch


def _left_pad(tensor: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    """`tensor` with zeros prepended along `dim` up to `width`."""
    missing = width - tensor.shape[dim]
    if missing == 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)
