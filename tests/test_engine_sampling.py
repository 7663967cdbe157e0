"""The HF engine's sampler: its hash of seed and token index, and its draws, against plain Python."""

from __future__ import annotations

import itertools
import random

import torch

from vistarl.trainer.rollout.engines.hf.sampling import Mode, RowSampling, SamplingRows, sample, uniforms
from vistarl.trainer.rollout.engines.sglang_api import SamplingParams

MASK64 = (1 << 64) - 1


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
