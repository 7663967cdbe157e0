"""The run's derived seeds: each reproducible draw of a run (a step's sampling seeds and mini-batch order,
an epoch's order of tasks or of SFT rows) is seeded by `train.seed` and a counter (the step, the epoch),
spaced so that no two (seed, counter) pairs give the same seed."""

from __future__ import annotations

import torch

__all__ = ["SEED_STRIDE", "derived_seed", "generator", "permutation"]

SEED_STRIDE = 1_000_003
"""Spacing of the seeds derived from one run seed: a prime above any step or epoch count."""


def derived_seed(seed: int, counter: int) -> int:
    """The seed of draw `counter` (a step, an epoch) of the run seeded `seed`."""
    return seed * SEED_STRIDE + counter


def generator(seed: int, counter: int) -> torch.Generator:
    """A CPU generator for draw `counter` of the run seeded `seed`: the same on every rank."""
    return torch.Generator().manual_seed(derived_seed(seed, counter))


def permutation(count: int, seed: int, counter: int) -> list[int]:
    """A shuffled order of `count` indices for draw `counter` of the run seeded `seed`."""
    return torch.randperm(count, generator=generator(seed, counter)).tolist()
