"""The running batch's KV cache in `HFEngine`: grown per step (`DynamicRows`) or preallocated in slots
whose decode step is captured in CUDA graphs (`StaticRows`, from a `StaticDecoder`).

Both take rows prefilled together (`Prefill`: the keys and values of prompts packed in one row, no
padding) and answer one decode step at a time with the next-token logits of the rows that go on.
`DynamicRows` is HF's eager decode: a DynamicCache grown by concatenation, its rows left-padded, a new
attention mask each step. For a small model that step is all launch overhead (a few
hundred kernels from Python, docs/benchmarks.md "GRPO step"), so on a GPU the engine decodes from a
`StaticDecoder` instead: every row holds a slot of a cache preallocated at `slots` x `cache_len`, its
prompt copied in aligned at position 0; each step writes one key and value per row at the row's own
write index, and attention reads the whole slot under a per-row validity mask. The shapes never change,
so each batch bucket's step (the first 1, 2, 4, ... slots) is captured once and replayed. On the CPU
the same step runs eagerly, which is how the tests hold it to the dynamic path.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from transformers import PreTrainedModel

from trainer.device import host_to_device


@dataclass
class Prefill:
    """Prompts prefilled together in one packed row: the prompt pass's DynamicCache (every layer's keys
    and values `[1, kv_heads, T, D]`), each prompt's length in packing order, and each row's next position."""

    cache: Any
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


def _rows(packed: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """`[rows, kv_heads, width, D]` from a packed `[1, kv_heads, T, D]`: row r's column c is packed
    column `columns[r, c]`."""
    rows, width = columns.shape
    picked = packed[0].index_select(1, columns.reshape(-1))
    return picked.view(packed.shape[1], rows, width, packed.shape[3]).transpose(0, 1)


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
        for layer in prefill.cache.layers:
            layer.keys = _rows(layer.keys, columns)
            layer.values = _rows(layer.values, columns)
        return cls(prefill.cache, valid.long(), prefill.next_positions)


class DecodeRows(Protocol):
    """The running batch's rows, in the order they joined, as the decode loop sees them."""

    def join(self, prefill: Prefill) -> None:
        """Append the rows of `prefill` after the current ones."""

    def step(self, keep: list[int], tokens: list[int]) -> torch.Tensor:
        """Keep only rows `keep` (indices into the current rows), feed each its token in `tokens` (one per
        kept row), and return their next-token logits `[len(keep), vocab]`."""

    def close(self) -> None:
        """Release what the rows hold (the batch ended)."""


class DynamicRows:
    """HF's eager decode over a DynamicCache; new rows are left-padded into it."""

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model
        self.batch: _LeftPadded | None = None

    @torch.inference_mode()
    def join(self, prefill: Prefill) -> None:
        rows = _LeftPadded.of(prefill)
        self.batch = rows if self.batch is None else _merge(self.batch, rows)

    @torch.inference_mode()
    def step(self, keep: list[int], tokens: list[int]) -> torch.Tensor:
        batch = self.batch
        assert batch is not None, "step before join"
        device = batch.attention_mask.device
        if len(keep) < batch.attention_mask.shape[0]:
            index = torch.tensor(keep, device=device)
            batch.cache.batch_select_indices(index)
            batch.attention_mask = batch.attention_mask[index]
            batch.next_positions = batch.next_positions[index]
        rows = len(keep)
        ones = torch.ones((rows, 1), dtype=batch.attention_mask.dtype, device=device)
        batch.attention_mask = torch.cat([batch.attention_mask, ones], dim=1)
        out = self.model(
            input_ids=torch.tensor(tokens, device=device).view(rows, 1),
            attention_mask=batch.attention_mask,
            position_ids=batch.next_positions.view(1, rows, 1).expand(3, rows, 1),
            past_key_values=batch.cache,
            use_cache=True,
        )
        batch.next_positions = batch.next_positions + 1
        logits: torch.Tensor = out.logits[:, -1]
        return logits

    def close(self) -> None:
        self.batch = None


class StaticRows:
    """The running batch's rows in the slots of a `StaticDecoder`."""

    def __init__(self, decoder: StaticDecoder) -> None:
        self.decoder = decoder
        self.slots: list[int] = []

    def join(self, prefill: Prefill) -> None:
        self.slots += self.decoder.admit(prefill)

    def step(self, keep: list[int], tokens: list[int]) -> torch.Tensor:
        kept = set(keep)
        self.decoder.release([slot for i, slot in enumerate(self.slots) if i not in kept])
        self.slots = [self.slots[i] for i in keep]
        return self.decoder.step(self.slots, tokens)

    def close(self) -> None:
        self.decoder.release(self.slots)
        self.slots = []


class _SlotView:
    """The first `rows` slots of a `StaticDecoder`'s cache as the HF attention layers use a cache: each
    `update` writes one key and value per row at the row's write index and returns the whole slots."""

    def __init__(self, decoder: StaticDecoder, rows: int) -> None:
        self.decoder = decoder
        self.rows = rows
        self.row_index = torch.arange(rows, device=decoder.device)

    def update(
        self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        keys = self.decoder.keys[layer_idx][: self.rows]
        values = self.decoder.values[layer_idx][: self.rows]
        write = self.decoder.write_index[: self.rows]
        keys[self.row_index, :, write] = key[:, :, 0]
        values[self.row_index, :, write] = value[:, :, 0]
        return keys, values

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Never read for positions (the engine passes them); a number for code that asks."""
        return 0


class StaticDecoder:
    """Decode steps for up to `slots` rows from a KV cache preallocated at `cache_len` positions a row.

    The buffers are allocated at the first `admit`, from the prefill's layer shapes. A row fits when its
    prompt and its whole token budget fit `cache_len`; the engine decodes the rows that don't with
    `DynamicRows`. With `cuda_graphs`, each bucket's step is captured once (a CUDA graph reads the
    model's parameters in place, so weight updates that copy into them need no new capture).
    """

    def __init__(self, model: PreTrainedModel, *, slots: int, cache_len: int, cuda_graphs: bool) -> None:
        self.model = model
        self.slots = slots
        self.cache_len = cache_len
        self.cuda_graphs = cuda_graphs
        self.device = next(model.parameters()).device
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.write_index = torch.zeros(slots, dtype=torch.long, device=self.device)
        self.positions = torch.zeros(slots, dtype=torch.long, device=self.device)
        self.valid = torch.zeros((slots, cache_len), dtype=torch.bool, device=self.device)
        self.input_ids = torch.zeros((slots, 1), dtype=torch.long, device=self.device)
        self._free = list(range(slots))
        self._steps: dict[int, Callable[[], torch.Tensor]] = {}
        self._pool: Any = None

    def fits(self, prompt_len: int, max_new_tokens: int) -> bool:
        """Whether a row of this prompt and budget fits a slot."""
        return prompt_len + max_new_tokens <= self.cache_len

    def rows(self) -> StaticRows:
        """An empty batch on this decoder's free slots."""
        return StaticRows(self)

    @torch.inference_mode()
    def admit(self, prefill: Prefill) -> list[int]:
        """Copy each prefilled prompt into a free slot (lowest first), from position 0 on; their slots."""
        rows, width = len(prefill.lengths), int(prefill.lengths.max())
        if rows > len(self._free):
            raise RuntimeError(f"{rows} rows for {len(self._free)} free slots")
        slots = [heapq.heappop(self._free) for _ in range(rows)]
        if not self.keys:
            self._allocate(prefill.cache.layers[0].keys)
        columns, _ = prefill.layout(width, left=False)
        index = torch.tensor(slots, device=self.device)
        for layer, source in enumerate(prefill.cache.layers):
            self.keys[layer][index, :, :width] = _rows(source.keys, columns)
            self.values[layer][index, :, :width] = _rows(source.values, columns)
        lengths = host_to_device(prefill.lengths, self.device)
        self.valid[index] = torch.arange(self.cache_len, device=self.device)[None, :] < lengths[:, None]
        self.write_index[index] = lengths
        self.positions[index] = prefill.next_positions.to(torch.long)
        return slots

    def release(self, slots: list[int]) -> None:
        """Give `slots` back; their contents are overwritten by the next `admit`."""
        for slot in slots:
            heapq.heappush(self._free, slot)

    @torch.inference_mode()
    def step(self, slots: list[int], tokens: list[int]) -> torch.Tensor:
        """Feed `tokens` to the rows in `slots`; their next-token logits, in that order."""
        bucket = _bucket(max(slots) + 1, self.slots)
        ids = torch.zeros(bucket, dtype=torch.long)
        ids[slots] = torch.tensor(tokens, dtype=torch.long)
        self.input_ids[:bucket, 0].copy_(ids, non_blocking=True)
        if bucket not in self._steps:
            self._steps[bucket] = self._capture(bucket)
        logits = self._steps[bucket]()
        self.write_index[:bucket].add_(1).clamp_(max=self.cache_len - 1)
        self.positions[:bucket].add_(1)
        return logits[torch.tensor(slots, device=self.device)]

    def _allocate(self, keys: torch.Tensor) -> None:
        """Key and value buffers `[slots, kv_heads, cache_len, head_dim]` per layer, like the prefill's."""
        shape = (self.slots, keys.shape[1], self.cache_len, keys.shape[3])
        layers = self.model.config.get_text_config().num_hidden_layers
        self.keys = [torch.zeros(shape, dtype=keys.dtype, device=self.device) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=keys.dtype, device=self.device) for _ in range(layers)]

    def _forward(self, view: _SlotView) -> torch.Tensor:
        """One decode step of the first `view.rows` slots: mark each write position valid, run the text
        model over the slot cache, and return the logits."""
        rows = view.rows
        write = self.write_index[:rows]
        self.valid[:rows].scatter_(1, write[:, None], True)
        out = self.model.model.language_model(
            input_ids=self.input_ids[:rows],
            attention_mask=self.valid[:rows, None, None, :],
            position_ids=self.positions[:rows].view(1, rows, 1).expand(3, rows, 1),
            past_key_values=view,
            use_cache=True,
        )
        logits: torch.Tensor = self.model.lm_head(out.last_hidden_state[:, -1])
        return logits

    def _capture(self, rows: int) -> Callable[[], torch.Tensor]:
        """The step of the first `rows` slots: captured in a CUDA graph, or run eagerly on the CPU.

        Capturing runs the step twice first (on a side stream, as capture requires); it only rewrites the
        write positions, which the step itself rewrites next, so it may happen while rows are live."""
        view = _SlotView(self, rows)
        if not self.cuda_graphs:
            return lambda: self._forward(view)
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._forward(view)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            logits = self._forward(view)
        return _GraphStep(graph, view, logits)


@dataclass
class _GraphStep:
    """A captured step: its graph, the logits it writes, and the slot view whose row index the graph
    reads (held here: freed, its memory would be reused under the graph)."""

    graph: torch.cuda.CUDAGraph
    view: _SlotView
    logits: torch.Tensor

    def __call__(self) -> torch.Tensor:
        self.graph.replay()
        return self.logits


def _bucket(rows: int, slots: int) -> int:
    """The smallest power of two at or above `rows`, at most `slots`: the step sizes that get graphs."""
    bucket = 1
    while bucket < rows:
        bucket *= 2
    return min(bucket, slots)


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
