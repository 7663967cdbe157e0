"""The HF engine's sampler against plain Python: its hash of seed and token index, the tokens top-k, top-p
and min-p keep (at their edges, on probabilities whose sums are exact in float32), and many seeded draws
against the filtered distribution. A wrong filter changes what the engine samples, not the logprobs it
reports, so nothing downstream would notice it."""

from __future__ import annotations

import itertools
import math
import random

import pytest
import torch

from vistarl.trainer.rollout.engines.hf.sampling import (
    Mode,
    RowSampling,
    SamplingRows,
    filtered,
    sample,
    uniforms,
)
from vistarl.trainer.rollout.engines.sglang_api import SamplingParams

MASK64 = (1 << 64) - 1
SIXTY_FOURTHS = (3, 32, 1, 16, 4, 8)
"""A distribution in 64ths, shuffled: ranked, 32 16 8 4 3 1, so every prefix mass is exact in float32."""
EXACT = [n / 64 for n in SIXTY_FOURTHS]


def splitmix_uniform(seed: int, index: int) -> float:
    """splitmix64 of (seed, index) on unsigned 64-bit integers, to [0, 1): the reference."""
    x = (seed * 0x9E3779B97F4A7C15 + (index + 1) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return ((x ^ (x >> 31)) >> 11) / float(1 << 53)


def test_uniforms_are_splitmix64_of_seed_and_index_for_any_seed() -> None:
    rng = random.Random(0)
    seeds = [0, 1, 7, (1 << 63) - 1, 1 << 63, (1 << 64) - 1, -1, -(1 << 70), 3 << 80]
    seeds += [rng.getrandbits(64) for _ in range(50)]
    indices = [0, 1, 2, 255, 4095, 1 << 40]
    settings = [RowSampling.of(SamplingParams(sampling_seed=seed), vocab=10) for seed in seeds]
    for index in indices:
        drawn = uniforms(
            torch.tensor([s.seed for s in settings], dtype=torch.long),
            torch.full((len(seeds),), index, dtype=torch.long),
        )
        expected = [splitmix_uniform(seed, index) for seed in seeds]
        assert drawn.tolist() == expected
        assert all(0.0 <= u < 1.0 for u in drawn.tolist())


def test_a_draw_is_the_inverse_cdf_at_the_rows_uniform_after_its_filters() -> None:
    """Each row draws by inverse CDF over its own temperature and filters; greedy rows take the argmax;
    every logprob is the unfiltered log-softmax at the row's temperature."""
    torch.manual_seed(0)
    logits = torch.randn(4, 50)
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.7, sampling_seed=3),
        SamplingParams(temperature=1.3, sampling_seed=4, top_k=5),
        SamplingParams(temperature=1.0, sampling_seed=5, top_p=0.5, min_p=0.05),
    ]
    settings = [RowSampling.of(p, vocab=50) for p in params]
    assert [s.mode for s in settings] == [Mode.GREEDY, Mode.DRAW, Mode.FILTERED, Mode.FILTERED]
    index = torch.tensor([0, 3, 1, 9])
    tokens, logprobs = sample(logits, SamplingRows.of(settings, torch.device("cpu")), index, Mode.FILTERED)
    for row, (p, setting) in enumerate(zip(params, settings, strict=True)):
        temperature = 1.0 if p.greedy else p.temperature
        logp = torch.log_softmax(logits[row] / temperature, dim=-1)
        assert logprobs[row].item() == logp[tokens[row]].item()
        if p.greedy:
            assert tokens[row].item() == int(logp.argmax())
            continue
        probs = logp.exp().double()
        ranked = sorted(range(50), key=lambda t: -probs[t].item())
        kept, mass = set(), 0.0
        for rank, token in enumerate(ranked):
            if (p.top_k != -1 and rank >= p.top_k) or mass >= p.top_p:
                break
            if probs[token] >= p.min_p * probs[ranked[0]]:
                kept.add(token)
            mass += probs[token].item()
        weights = [probs[t].item() if t in kept else 0.0 for t in range(50)]
        target = splitmix_uniform(setting.seed, int(index[row])) * sum(weights)
        cumulative = list(itertools.accumulate(weights))
        assert tokens[row].item() == next(t for t, total in enumerate(cumulative) if total > target)


def kept_tokens(probs: list[float], top_k: int = -1, top_p: float = 1.0, min_p: float = 0.0) -> set[int]:
    """The reference: the `top_k` most likely tokens, of those the ones whose mass ranked above is below
    `top_p`, of those the ones at least `min_p` times the most likely."""
    ranked = sorted(range(len(probs)), key=lambda t: -probs[t])
    kept, above = set(), 0.0
    for rank, token in enumerate(ranked):
        if (top_k == -1 or rank < top_k) and above < top_p and probs[token] >= min_p * probs[ranked[0]]:
            kept.add(token)
        above += probs[token]
    return kept


def rows_of(params: list[SamplingParams], vocab: int) -> SamplingRows:
    return SamplingRows.of([RowSampling.of(p, vocab=vocab) for p in params], torch.device("cpu"))


EDGES = [
    {"top_k": 1},
    {"top_k": 2},
    {"top_k": 5},
    {"top_k": 6},
    {"top_p": 1e-6},  # the most likely token always stays
    {"top_p": 0.5},  # the first token's mass is exactly p: it alone reaches p
    {"top_p": 0.5 + 2**-20},
    {"top_p": 0.75},
    {"top_p": 0.75 + 2**-20},
    {"top_p": 63 / 64},  # the last token's mass above is exactly p: it goes
    {"top_p": 0.999},
    {"min_p": 0.125},  # 4/64 is exactly 0.125 * 32/64: it stays, 3/64 goes
    {"min_p": 0.125 + 2**-20},
    {"min_p": 1.0},
    {"min_p": 1 / 32},  # the least likely token is exactly at the threshold
    {"top_k": 4, "top_p": 0.8, "min_p": 0.2},
    {"top_k": 2, "top_p": 0.9},
    {"top_k": 5, "min_p": 0.1},
    {"top_p": 0.9, "min_p": 0.3},
]


@pytest.mark.parametrize("setting", EDGES, ids=lambda s: ",".join(f"{k}={v:g}" for k, v in s.items()))
def test_the_filters_keep_the_reference_tokens_at_their_edges(setting: dict[str, float]) -> None:
    probs = torch.tensor([EXACT, EXACT[::-1]])
    rows = rows_of([SamplingParams(sampling_seed=1, **setting)] * 2, vocab=len(EXACT))
    out = filtered(probs, rows)
    for row in range(2):
        expected = kept_tokens(probs[row].tolist(), **setting)
        assert {t for t in range(len(EXACT)) if out[row, t] > 0} == expected
        assert all(out[row, t] == probs[row, t] for t in expected)  # kept unrenormalised


def test_each_row_keeps_the_reference_tokens_of_its_own_filters() -> None:
    """Random distributions over a 40-token vocabulary, each row with filters of its own."""
    rng = random.Random(5)
    torch.manual_seed(5)
    probs = torch.softmax(torch.randn(64, 40) * 2, dim=-1)
    params = [
        SamplingParams(
            sampling_seed=row,
            top_k=rng.choice([-1, 1, 3, 10, 39, 40]),
            top_p=rng.choice([1.0, rng.random()]),
            min_p=rng.choice([0.0, rng.random() / 2]),
        )
        for row in range(64)
    ]
    out = filtered(probs, rows_of(params, vocab=40))
    for row, p in enumerate(params):
        expected = kept_tokens(probs[row].double().tolist(), p.top_k, p.top_p, p.min_p)
        assert {t for t in range(40) if out[row, t] > 0} == expected, p


DRAWN = [
    {},
    {"temperature": 0.5},
    {"top_k": 3},
    {"top_p": 0.7},
    {"top_p": 0.9},
    {"min_p": 0.1},
    {"top_k": 5, "top_p": 0.9, "min_p": 0.1, "temperature": 1.5},
]


@pytest.mark.parametrize(
    "setting", DRAWN, ids=lambda s: ",".join(f"{k}={v:g}" for k, v in s.items()) or "plain"
)
def test_many_seeded_draws_follow_the_filtered_distribution(setting: dict[str, float]) -> None:
    """20,000 draws (one seed, token indices 0..19,999) from fixed logits: no dropped token is drawn, each
    kept token's count is within 5 standard deviations of its renormalised share, and the chi-square
    statistic is within its 99.9% bound. The uniforms are a hash, so the counts are the same every run."""
    draws = 20_000
    params = SamplingParams(sampling_seed=12345, **setting)
    setting_row = RowSampling.of(params, vocab=len(EXACT))
    logits = torch.tensor(EXACT).log()[None, :].expand(draws, -1)
    rows = SamplingRows.of([setting_row] * draws, torch.device("cpu"))
    tokens, _ = sample(logits, rows, torch.arange(draws), setting_row.mode)
    tempered = torch.softmax(torch.tensor(EXACT).double().log() / params.temperature, dim=-1).tolist()
    kept = kept_tokens(tempered, params.top_k, params.top_p, params.min_p)
    total = sum(tempered[t] for t in kept)
    counts = torch.bincount(tokens, minlength=len(EXACT)).tolist()
    assert {t for t, n in enumerate(counts) if n} == kept
    chi_square = 0.0
    for token in kept:
        share = tempered[token] / total
        spread = math.sqrt(draws * share * (1 - share)) if share < 1 else 0.0
        assert abs(counts[token] - draws * share) <= 5 * spread, (token, counts, share)
        chi_square += (counts[token] - draws * share) ** 2 / (draws * share)
    assert chi_square <= CHI_SQUARE_999[len(kept) - 1]


CHI_SQUARE_999 = [0.0, 10.83, 13.82, 16.27, 18.47, 20.52]
"""The chi-square distribution's 99.9th percentile by degrees of freedom (0 to 5)."""
