"""`keep_freed_memory`: a process that frees its per-request memory does not fault it in again."""

from __future__ import annotations

import subprocess
import sys

import pytest

ROUNDS = """
import resource, sys
from services.server.malloc_tuning import keep_freed_memory
tuned = sys.argv[1] == "tuned" and keep_freed_memory()
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(50):  # a request's worth of 100 kB blocks, built and freed
    blocks = [b"x" * 100_000 for _ in range(10)]
    del blocks
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults, tuned)
"""


def faults_over_rounds(mode: str) -> tuple[int, bool]:
    """Minor page faults of 50 rounds of building and freeing 1 MB in a fresh process, and whether
    `keep_freed_memory` took effect there."""
    done = subprocess.run([sys.executable, "-c", ROUNDS, mode], capture_output=True, text=True, check=True)
    faults, tuned = done.stdout.split()
    return int(faults), tuned == "True"


def test_freed_memory_stays_with_the_process_for_the_next_request() -> None:
    (default, _), (tuned, took) = faults_over_rounds("default"), faults_over_rounds("tuned")
    if not took:
        pytest.skip("this C library has no mallopt (not glibc)")
    assert default > 50 * 100  # glibc trims the freed megabyte and faults it in again each round
    assert tuned < default / 10
