"""The built-in `train` and `test` splits: generated problems addressed by index, made on demand.

Row i of a split is the problem of a seed found by a fixed search, so rows are deterministic and
cost nothing until read. The splits never share a seed (train seeds are even, test seeds odd) nor a
problem: a problem belongs to `test` when the hash of its mathematical content (`key`: template and
numbers) falls in one bucket of `TEST_BUCKETS`, to `train` otherwise, and each split's search skips
candidates of the other. Templates with few possible problems may so have none in `test`.
"""

from __future__ import annotations

import hashlib
from typing import Any

from vistarl.services.env_api import GeneratedSplit, TaskSplit
from vistarl.services.geo3k.generator import GeneratedProblem, generate

SPLIT_SIZES = {"train": 10_000, "test": 1_000}
SPLIT_PARITY = {"train": 0, "test": 1}
TEST_BUCKETS = 5
CANDIDATES_PER_ROW = 256


def in_test(key: str) -> bool:
    """Whether a problem with this content key belongs to the test split."""
    return int(hashlib.sha256(key.encode()).hexdigest(), 16) % TEST_BUCKETS == 0


def split_problem(split: str, index: int) -> GeneratedProblem:
    """Row `index` of `split`: the first of its candidate seeds whose problem belongs to the split."""
    parity, want_test = SPLIT_PARITY[split], split == "test"
    for attempt in range(CANDIDATES_PER_ROW):
        problem = generate(2 * (index * CANDIDATES_PER_ROW + attempt) + parity)
        if in_test(problem.key) == want_test:
            return problem
    raise RuntimeError(f"{split}/{index}: no candidate of {CANDIDATES_PER_ROW} seeds belongs to the split")


def split_sample(split: str, index: int) -> dict[str, Any]:
    """Row `index` of `split` as a JSON-safe sample."""
    return split_problem(split, index).sample()


def builtin_splits() -> dict[str, TaskSplit]:
    """The generated `train` and `test` splits."""
    return {name: GeneratedSplit(name, size, split_sample) for name, size in SPLIT_SIZES.items()}
