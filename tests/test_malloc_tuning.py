"""`keep_freed_memory`: a process that frees its per-request memory does not fault it in again."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.machine import require

ROUNDS = """
import resource, sys
from vistarl.services.server.malloc_tuning import keep_freed_memory
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


def glibc_version() -> str:
    """The glibc this process runs on ("" on another C library): asked of the C library's own
    configuration, not of `keep_freed_memory`, whose answer is what the test checks."""
    try:
        return os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):  # the name is unknown where the C library is not glibc
        return ""


def test_freed_memory_stays_with_the_process_for_the_next_request() -> None:
    require(glibc_version().startswith("glibc"), "this C library is not glibc (mallopt is glibc's)")
    (default, _), (tuned, took) = faults_over_rounds("default"), faults_over_rounds("tuned")
    assert took, f"{glibc_version()} is there, yet keep_freed_memory() did not take"
    assert default > 50 * 100  # glibc trims the freed megabyte and faults it in again each round
    assert tuned < default / 10
