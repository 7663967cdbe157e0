"""The HF engine's sampler: every row's next token with its own params, as tensor work on the device.

One function serves the prompt pass's first tokens and every decode step, eager or captured in a CUDA
graph: nothing in it reads a value back to the host. A row's logprob is SGLang's,
`log_softmax(logits / temperature)` before top-k / top-p / min-p (plain `log_softmax` when greedy). A drawn
token is the inverse CDF at a uniform that is a hash (splitmix64) of the row's seed and the token's index,
so a seeded request draws the same tokens in any batch, at any step of it.
"""

from __future__ import annotations

import dataclasses
import enum
import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from vistarl.trainer.rollout.engines.sglang_api import TOP_K_ALL, SamplingParams


class Mode(enum.IntEnum):
    """What a batch's rows need: the argmax only, a draw, or a draw after top-k / top-p / min-p. Ordered,
    so a batch's mode is the largest of its rows' (a CUDA graph is captured per mode)."""

    GREEDY = 0
    DRAW = 1
    FILTERED = 2


@dataclass(frozen=True)
class RowSampling:
    """One row's sampling settings, as the sampler takes them: greedy rows keep temperature 1 (their
    logprobs are plain `log_softmax`), `top_k` is the vocabulary when unset, `seed` a signed 64-bit int."""

    temperature: float
    greedy: bool
    top_k: int
    top_p: float
    min_p: float
    seed: int
    mode: Mode

    @classmethod
    def of(cls, params: SamplingParams, vocab: int) -> RowSampling:
        """A request's settings, with its `sampling_seed` (reproducible) or a random seed."""
        seed = params.sampling_seed if params.sampling_seed is not None else random.getrandbits(63)
        top_k = vocab if params.top_k == TOP_K_ALL else min(params.top_k, vocab)
        filtered = top_k < vocab or params.top_p < 1.0 or params.min_p > 0.0
        return cls(
            temperature=1.0 if params.greedy else params.temperature,
            greedy=params.greedy,
            top_k=top_k,
            top_p=params.top_p,
            min_p=params.min_p,
            seed=0 if params.greedy else _int64(seed),
            mode=Mode.GREEDY if params.greedy else Mode.FILTERED if filtered else Mode.DRAW,
        )


@dataclass
class SamplingRows:
    """The sampling settings of a batch's rows as tensors `[R]` on the device, one field a setting."""

    temperature: torch.Tensor  # float32
    greedy: torch.Tensor  # bool
    top_k: torch.Tensor  # int64
    top_p: torch.Tensor  # float32
    min_p: torch.Tensor  # float32
    seed: torch.Tensor  # int64

    @classmethod
    def empty(cls, rows: int, device: torch.device) -> SamplingRows:
        """`rows` rows of greedy settings: the buffers a static decoder writes its slots' settings into."""
        return cls.of([RowSampling(1.0, True, 1, 1.0, 0.0, 0, Mode.GREEDY)] * rows, device)

    @classmethod
    def of(cls, rows: Sequence[RowSampling], device: torch.device) -> SamplingRows:
        """`rows` as tensors on `device`."""

        def column(name: str, dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor([getattr(row, name) for row in rows], dtype=dtype, device=device)

        return cls(
            temperature=column("temperature", torch.float32),
            greedy=column("greedy", torch.bool),
            top_k=column("top_k", torch.int64),
            top_p=column("top_p", torch.float32),
            min_p=column("min_p", torch.float32),
            seed=column("seed", torch.int64),
        )

    def write(self, index: torch.Tensor, rows: SamplingRows) -> None:
        """Set the rows at `index` to `rows`, in place (the addresses a captured graph reads stay)."""
        for field in dataclasses.fields(self):
            getattr(self, field.name)[index] = getattr(rows, field.name)

    def head(self, count: int) -> SamplingRows:
        """The first `count` rows, as views."""
        return SamplingRows(**{f.name: getattr(self, f.name)[:count] for f in dataclasses.fields(self)})


def sample(
    logits: torch.Tensor, rows: SamplingRows, index: torch.Tensor, mode: Mode
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's token (int64 `[R]`) and its logprob (float32 `[R]`) from `logits` `[R, V]`; `index`
    (int64 `[R]`) is the index of the token each row draws, which picks its uniform."""
    logp = torch.log_softmax(logits.float() / rows.temperature[:, None], dim=-1)
    tokens = logp.argmax(dim=-1)
    if mode != Mode.GREEDY:
        probs = logp.exp()
        if mode == Mode.FILTERED:
            probs = filtered(probs, rows)
        cdf = probs.double().cumsum(dim=-1)
        target = (uniforms(rows.seed, index) * cdf[:, -1])[:, None]
        drawn = torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp_(max=probs.shape[-1] - 1)
        tokens = torch.where(rows.greedy, tokens, drawn)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)


def filtered(probs: torch.Tensor, rows: SamplingRows) -> torch.Tensor:
    """`probs` with what each row's filters drop set to 0, in SGLang's order: top-k keeps the `top_k` most
    likely tokens; top-p keeps a token while the mass ranked above it is below `top_p` (the shortest
    prefix whose mass reaches it, over the unrenormalised top-k); min-p keeps a token whose probability is
    at least `min_p` times the largest."""
    vocab = probs.shape[-1]
    ordered, order = probs.sort(dim=-1, descending=True)
    keep = torch.arange(vocab, device=probs.device)[None, :] < rows.top_k[:, None]
    keep &= (ordered.cumsum(dim=-1) - ordered) < rows.top_p[:, None]
    keep &= ordered >= rows.min_p[:, None] * ordered[:, :1]
    return torch.zeros_like(probs).scatter_(-1, order, ordered * keep)


def uniforms(seed: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """A uniform in [0, 1) (float64) per row from its seed and the index of the token it draws:
    splitmix64 in int64 arithmetic, which wraps as the unsigned hash does; shifts are made logical."""
    x = seed * _GOLDEN + (index + 1) * _MIX1
    x = (x ^ _shift(x, 30)) * _MIX1
    x = (x ^ _shift(x, 27)) * _MIX2
    return _shift(x ^ _shift(x, 31), 11).double() / float(1 << 53)


def _shift(x: torch.Tensor, bits: int) -> torch.Tensor:
    """`x >> bits` as on an unsigned 64-bit integer."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _int64(value: int) -> int:
    """`value` modulo 2**64 as a signed 64-bit int: what a hash that keeps the low 64 bits sees of it."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


_GOLDEN = _int64(0x9E3779B97F4A7C15)
_MIX1 = _int64(0xBF58476D1CE4E5B9)
_MIX2 = _int64(0x94D049BB133111EB)
