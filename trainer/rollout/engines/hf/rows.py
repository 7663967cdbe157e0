"""The running batch's rows in `HFEngine`: what a prompt pass hands over and what a decode backend does.

Both backends take rows prefilled together (`Prefill`: the keys and values of prompts packed in one row, no
padding, each prompt's cached prefix before the rest its prompt pass computed) with each row's first token,
and `launch` one decode step at a time for the rows that go on (`DecodeRows`): the step feeds each row the
token it drew last, draws the next (`sampling.sample`) and keeps it on the device for the step after.
Nothing waits for the host between steps: a launched `Step` is read later, so the engine decides which rows
finished while the next step already runs (docs/benchmarks.md, "The HF engine's decode step"). Either
gives a row's keys and values back (`prefix_of`) for the prefix cache when its request finishes.

The backends: `dynamic_rows.DynamicRows` (HF's eager decode, grown per step) and the slots of a
`static_decoder.StaticDecoder` (a preallocated cache whose decode steps are captured in CUDA graphs).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from vistarl.trainer.modeling.device import host_to_device
from vistarl.trainer.rollout.engines.hf.sampling import RowSampling


@dataclass
class KV:
    """One layer's keys and values."""

    keys: torch.Tensor
    values: torch.Tensor


class PromptPassCache:
    """The cache a prompt pass runs with: every layer's keys and values of the whole prompts, packed in one
    row `[1, kv_heads, T, D]`, each prompt's cached prefix (`prefixes`, `[layers, 2, kv_heads, P, D]`, or
    None) put before the keys and values the pass computes for the rest of it (`rests`, their lengths in
    packing order). Attention reads the whole prompts' keys; queries are the rests' tokens alone."""

    def __init__(self, prefixes: Sequence[torch.Tensor | None], rests: Sequence[int]) -> None:
        self.prefixes = prefixes
        self.rests = rests
        self.layers: list[KV] = []

    def update(
        self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if layer_idx != len(self.layers):
            raise RuntimeError(f"layer {layer_idx} of a prompt pass after {len(self.layers)} layers")
        if any(prefix is not None for prefix in self.prefixes):
            key, value = (
                self._whole(computed, layer_idx, half) for half, computed in enumerate((key, value))
            )
        self.layers.append(KV(key, value))
        return key, value

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Never read for positions (the engine passes them); a number for code that asks."""
        return 0

    def _whole(self, computed: torch.Tensor, layer: int, half: int) -> torch.Tensor:
        """The packed row of whole prompts from the rests' `computed` keys (`half` 0) or values (1)."""
        pieces = []
        for prefix, rest in zip(self.prefixes, computed[0].split(list(self.rests), dim=1), strict=True):
            if prefix is not None:
                pieces.append(prefix[layer, half])
            pieces.append(rest)
        return torch.cat(pieces, dim=1)[None]


@dataclass
class Prefill:
    """Prompts prefilled together in one packed row: the prompt pass's cache (every layer's keys and values
    of the whole prompts), each prompt's length in packing order, and each row's next position."""

    cache: PromptPassCache
    lengths: torch.Tensor  # (rows,) int64 on the host; the prompts fill the packed row in this order
    next_positions: torch.Tensor  # (rows,) mRoPE position of each row's next token

    def layout(self, width: int, *, left: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """The packed column that each of `rows` x `width` cache columns copies, and whether it holds a
        prompt token: each prompt right-aligned (`left` padding) or from column 0 on. Padding columns copy
        a token of their own row; attention never reads them."""
        lengths = self.lengths[:, None]
        offset = torch.arange(width)[None, :] - (width - lengths if left else 0)
        valid = (offset >= 0) & (offset < lengths)
        columns = (lengths.cumsum(0) - lengths) + torch.minimum(offset.clamp(min=0), lengths - 1)
        device = self.next_positions.device
        return host_to_device(columns, device), host_to_device(valid, device)


def unpack_rows(packed: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """`[rows, kv_heads, width, D]` from a packed `[1, kv_heads, T, D]`: row r's column c is packed
    column `columns[r, c]`."""
    rows, width = columns.shape
    picked = packed[0].index_select(1, columns.reshape(-1))
    return picked.view(packed.shape[1], rows, width, packed.shape[3]).transpose(0, 1)


class Step(Protocol):
    """A launched decode step: `results` waits for it and gives each launched row's token and logprob."""

    def results(self) -> tuple[list[int], list[float]]: ...


class DecodeRows(Protocol):
    """The running batch's rows, each known by the key it joined with."""

    def join(
        self, prefill: Prefill, keys: Sequence[Hashable], sampling: Sequence[RowSampling], first: torch.Tensor
    ) -> None:
        """Add the rows of `prefill` under `keys`, with their settings and the first tokens they drew
        (`first`, int64 on the device)."""

    def keep(self, keys: Sequence[Hashable]) -> None:
        """Keep rows `keys`, in that order; the others have left (their room goes to rows that join)."""

    def launch(self, keys: Sequence[Hashable]) -> Step:
        """Start the next step of rows `keys` (`keep(keys)` first)."""

    def prefix_of(self, key: Hashable, length: int) -> torch.Tensor:
        """A copy of the keys and values of row `key`'s first `length` positions, every layer's,
        `[layers, 2, kv_heads, length, D]` (for the prefix cache; the row's later steps never change them)."""

    def close(self) -> None:
        """Release what the rows hold (the batch ended)."""


@dataclass
class Ready:
    """A step's picks, still on the device until read: one host sync for both."""

    tokens: torch.Tensor
    logprobs: torch.Tensor

    def results(self) -> tuple[list[int], list[float]]:
        tokens, logprobs = torch.stack([self.tokens.double(), self.logprobs.double()]).tolist()
        return [int(t) for t in tokens], logprobs


@torch.inference_mode()
def stacked_positions(layers: Sequence[Any], row: int, positions: slice) -> torch.Tensor:
    """Row `row`'s keys and values at `positions` of every layer (`.keys`, `.values` `[rows, kv_heads, T,
    D]`), copied in one `[layers, 2, kv_heads, P, D]` tensor."""
    halves = [half[row, :, positions] for layer in layers for half in (layer.keys, layer.values)]
    return torch.stack(halves).unflatten(0, (len(layers), 2))
