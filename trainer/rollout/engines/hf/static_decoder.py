"""`StaticDecoder`: decode steps over the slots of a preallocated KV cache, captured in CUDA graphs;
`StaticRows`, the running batch's rows in its slots.

For a small model HF's eager step (`dynamic_rows.DynamicRows`) is all launch overhead, and HF's attention
reads the whole cache with every kv head copied per query head, so on a GPU the engine decodes from a
`StaticDecoder` instead: every row holds a slot of a cache preallocated at `slots` x `cache_len`, its prompt
copied in at position 0; each step writes one key and value per row at the row's own length, and attention
(`vistarl.trainer.modeling.attention.GROUPED_DECODE_ATTENTION`) reads each kv head once, over the first
`length` positions of the slots, under a mask of each row's own. Each (rows, length, sampling mode) bucket's
step, the sampler and the bookkeeping of lengths and positions included, is captured once and replayed. On
the CPU the same step runs eagerly, which is how the tests hold it to the dynamic path.
"""

from __future__ import annotations

import functools
import heapq
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedModel

from vistarl.trainer.modeling.attention import GROUPED_DECODE_ATTENTION, attention_for
from vistarl.trainer.modeling.device import host_to_device
from vistarl.trainer.rollout.engines.hf.fused import Fusions
from vistarl.trainer.rollout.engines.hf.rows import KV, Prefill, Step, stacked_positions, unpack_rows
from vistarl.trainer.rollout.engines.hf.sampling import Mode, RowSampling, SamplingRows, sample


class StaticRows:
    """The running batch's rows in the slots of a `StaticDecoder`."""

    def __init__(self, decoder: StaticDecoder) -> None:
        self.decoder = decoder
        self.slots: dict[Hashable, int] = {}

    def join(
        self, prefill: Prefill, keys: Sequence[Hashable], sampling: Sequence[RowSampling], first: torch.Tensor
    ) -> None:
        self.slots.update(zip(keys, self.decoder.admit(prefill, sampling, first), strict=True))

    def keep(self, keys: Sequence[Hashable]) -> None:
        going = set(keys)
        left = [key for key in self.slots if key not in going]
        self.decoder.release([self.slots.pop(key) for key in left])

    def launch(self, keys: Sequence[Hashable]) -> Step:
        self.keep(keys)
        return self.decoder.launch([self.slots[key] for key in keys])

    def prefix_of(self, key: Hashable, length: int) -> torch.Tensor:
        decoder = self.decoder
        layers = [KV(keys, values) for keys, values in zip(decoder.keys, decoder.values, strict=True)]
        return stacked_positions(layers, self.slots[key], slice(0, length))

    def close(self) -> None:
        self.decoder.release(list(self.slots.values()))
        self.slots = {}


class _SlotView:
    """The first `rows` slots of a `StaticDecoder`'s cache as the HF attention layers use a cache: each
    `update` writes one key and value per row at the row's length and returns the slots' first `length`
    positions."""

    def __init__(self, decoder: StaticDecoder, rows: int, length: int) -> None:
        self.decoder = decoder
        self.rows = rows
        self.length = length
        self.row_index = torch.arange(rows, device=decoder.device)

    def update(
        self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        keys = self.decoder.keys[layer_idx][: self.rows]
        values = self.decoder.values[layer_idx][: self.rows]
        write = self.decoder.lengths[: self.rows]
        keys[self.row_index, :, write] = key[:, :, 0]
        values[self.row_index, :, write] = value[:, :, 0]
        return keys[:, :, : self.length], values[:, :, : self.length]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Never read for positions (the engine passes them); a number for code that asks."""
        return 0


@dataclass
class _Picks:
    """Where a step's tokens and logprobs land on the host (pinned on a GPU), and when they are there."""

    tokens: torch.Tensor
    logprobs: torch.Tensor
    ready: torch.cuda.Event | None

    @classmethod
    def allocate(cls, slots: int, device: torch.device) -> _Picks:
        pinned = device.type == "cuda"
        tokens = torch.zeros(slots, dtype=torch.long, pin_memory=pinned)
        logprobs = torch.zeros(slots, dtype=torch.float32, pin_memory=pinned)
        return cls(tokens, logprobs, torch.cuda.Event() if pinned else None)


@dataclass
class _SlotStep:
    """A launched step of a `StaticDecoder`: its picks for slots `slots`, copied to `picks` on arrival."""

    picks: _Picks
    slots: list[int]

    def results(self) -> tuple[list[int], list[float]]:
        if self.picks.ready is not None:
            self.picks.ready.synchronize()
        tokens, logprobs = self.picks.tokens.tolist(), self.picks.logprobs.tolist()
        return [tokens[slot] for slot in self.slots], [logprobs[slot] for slot in self.slots]


class StaticDecoder:
    """Decode steps for up to `slots` rows from a KV cache preallocated at `cache_len` positions a row.

    The buffers are allocated at the first `admit`, from the prefill's layer shapes. A row fits when its
    prompt and its whole token budget fit `cache_len`; the engine decodes the rows that don't with
    `DynamicRows`. With `cuda_graphs`, each bucket's step is captured once (a CUDA graph reads the
    model's parameters in place, so weight updates that copy into them need no new capture).

    Per slot, on the device: its length (the next write index), its next position, the index of the token
    it draws next, its last token (the last step's pick), that token's logprob, and its sampling settings.
    On the host: each
    slot's length and sampling mode, which choose a step's bucket without asking the device.
    """

    def __init__(
        self, model: PreTrainedModel, fusions: Fusions, *, slots: int, cache_len: int, cuda_graphs: bool
    ) -> None:
        self.model = model
        self.slots = slots
        self.cache_len = cache_len
        self.cuda_graphs = cuda_graphs
        self.device = next(model.parameters()).device
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []

        def zeros(*shape: int, dtype: torch.dtype = torch.long) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=self.device)

        self.lengths = zeros(slots)
        self.positions = zeros(slots)
        self.index = zeros(slots)
        self.input_ids = zeros(slots, 1)
        self.sampling = SamplingRows.empty(slots, self.device)
        self.logprobs = zeros(slots, dtype=torch.float32)  # the last step's; its tokens are `input_ids`
        self.fusions = fusions
        self._picks = [_Picks.allocate(slots, self.device) for _ in range(2)]  # read one, fill the other
        self._turn = 0
        self._host_lengths = [0] * slots
        self._modes = [Mode.GREEDY] * slots
        self._free = list(range(slots))
        self._steps: dict[tuple[int, int, Mode], Callable[[], None]] = {}
        self._pool: Any = None

    def fits(self, prompt_len: int, max_new_tokens: int) -> bool:
        """Whether a row of this prompt and budget fits a slot."""
        return prompt_len + max_new_tokens <= self.cache_len

    def rows(self) -> StaticRows:
        """An empty batch on this decoder's free slots."""
        return StaticRows(self)

    @torch.inference_mode()
    def admit(self, prefill: Prefill, sampling: Sequence[RowSampling], first: torch.Tensor) -> list[int]:
        """Copy each prefilled prompt into a free slot (lowest first), from position 0 on, with its
        settings and first token; their slots."""
        rows, width = len(prefill.lengths), int(prefill.lengths.max())
        if rows > len(self._free):
            raise RuntimeError(f"{rows} rows for {len(self._free)} free slots")
        slots = [heapq.heappop(self._free) for _ in range(rows)]
        if not self.keys:
            self._allocate(prefill.cache.layers[0].keys)
        columns, _ = prefill.layout(width, left=False)
        index = host_to_device(torch.tensor(slots), self.device)
        for layer, source in enumerate(prefill.cache.layers):
            self.keys[layer][index, :, :width] = unpack_rows(source.keys, columns)
            self.values[layer][index, :, :width] = unpack_rows(source.values, columns)
        self.lengths[index] = host_to_device(prefill.lengths, self.device)
        self.positions[index] = prefill.next_positions.to(torch.long)
        self.index[index] = 1  # the first token, index 0, was drawn from the prompt pass
        self.input_ids[index, 0] = first
        self.sampling.write(index, SamplingRows.of(sampling, self.device))
        for slot, length, setting in zip(slots, prefill.lengths.tolist(), sampling, strict=True):
            self._host_lengths[slot] = length
            self._modes[slot] = setting.mode
        return slots

    def release(self, slots: list[int]) -> None:
        """Give `slots` back; their contents are overwritten by the next `admit`."""
        for slot in slots:
            heapq.heappush(self._free, slot)

    @torch.inference_mode()
    def launch(self, slots: list[int]) -> Step:
        """Start the step of the rows in `slots`: the smallest bucket that holds them, its graph replayed
        (or run, without graphs), and its picks copied towards the host."""
        rows = _bucket(max(slots) + 1, self.slots)
        length = _length_bucket(max(self._host_lengths[slot] for slot in slots) + 1, self.cache_len)
        mode = max(self._modes[slot] for slot in slots)
        key = (rows, length, mode)
        if key not in self._steps:
            self._steps[key] = self._capture(rows, length, mode)
        self._steps[key]()
        for slot in slots:
            self._host_lengths[slot] = min(self._host_lengths[slot] + 1, self.cache_len - 1)
        picks = self._picks[self._turn]
        self._turn ^= 1
        picks.tokens[:rows].copy_(self.input_ids[:rows, 0], non_blocking=True)
        picks.logprobs[:rows].copy_(self.logprobs[:rows], non_blocking=True)
        if picks.ready is not None:
            picks.ready.record()
        return _SlotStep(picks, slots)

    def _allocate(self, keys: torch.Tensor) -> None:
        """Key and value buffers `[slots, kv_heads, cache_len, head_dim]` per layer, like the prefill's."""
        shape = (self.slots, keys.shape[1], self.cache_len, keys.shape[3])
        layers = self.model.config.get_text_config().num_hidden_layers
        self.keys = [torch.zeros(shape, dtype=keys.dtype, device=self.device) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=keys.dtype, device=self.device) for _ in range(layers)]

    def _forward(self, view: _SlotView, mode: Mode) -> None:
        """One decode step of the first `view.rows` slots: each row's last token through the text model
        over its slot, the next token drawn, and the slot's length, position and draw index moved on."""
        rows = view.rows
        lengths = self.lengths[:rows]
        mask = torch.arange(view.length, device=self.device)[None, :] <= lengths[:, None]
        text_model = self.model.model.language_model
        with (
            attention_for(text_model, GROUPED_DECODE_ATTENTION),
            self.fusions.applied(),
        ):
            out = text_model(
                input_ids=self.input_ids[:rows],
                attention_mask=mask[:, None, None, :],
                position_ids=self.positions[:rows].view(1, rows, 1).expand(3, rows, 1),
                past_key_values=view,
                use_cache=True,
            )
        logits = self.model.lm_head(out.last_hidden_state[:, -1])
        tokens, logprobs = sample(logits, self.sampling.head(rows), self.index[:rows], mode)
        self.logprobs[:rows] = logprobs
        self.input_ids[:rows, 0] = tokens
        lengths.add_(1).clamp_(max=self.cache_len - 1)  # a row that ran past its budget writes in place
        self.positions[:rows].add_(1)
        self.index[:rows].add_(1)

    def _capture(self, rows: int, length: int, mode: Mode) -> Callable[[], None]:
        """The step of the first `rows` slots over `length` positions: captured in a CUDA graph, or run
        eagerly on the CPU.

        Capturing runs the step twice first (on a side stream, as capture requires) and then puts back
        what those runs moved on (lengths, positions, draw indices, last tokens), so it may happen while
        rows are live: the keys and values they wrote sit at positions the real steps write again first."""
        step = functools.partial(self._forward, _SlotView(self, rows, length), mode)
        if not self.cuda_graphs:
            return step
        moved = (self.lengths, self.positions, self.index, self.input_ids)
        state = [t[:rows].clone() for t in moved]
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                step()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            step()  # thread_local: a learner on another thread of this process may use the GPU meanwhile
        for live, saved in zip(
            (self.lengths, self.positions, self.index, self.input_ids), state, strict=True
        ):
            live[:rows] = saved
        return _Replay(graph, step)


@dataclass
class _Replay:
    """A captured step: its graph, and the step it replays, held with the slot view whose row index the
    graph reads (freed, its memory would be reused under the graph)."""

    graph: torch.cuda.CUDAGraph
    step: Callable[[], None]

    def __call__(self) -> None:
        self.graph.replay()


def _bucket(rows: int, slots: int) -> int:
    """The smallest power of two at or above `rows`, at most `slots`: the step sizes that get graphs."""
    bucket = 1
    while bucket < rows:
        bucket *= 2
    return min(bucket, slots)


def _length_bucket(length: int, cache_len: int) -> int:
    """The cache positions a step attends over: the first of 128, 192, 256, 384, 512, 768, ... (powers of two
    and the halfway points, so at most a third is masked) at or above `length`, at most `cache_len`."""
    bucket = 128
    while bucket < length:
        bucket = bucket * 3 // 2 if bucket & (bucket - 1) == 0 else bucket * 4 // 3
    return min(bucket, cache_len)
