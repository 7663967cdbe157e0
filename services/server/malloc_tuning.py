"""Keep glibc's malloc from handing a server's freed memory back to the kernel between requests.

By default glibc returns the free top of its heap to the kernel once it passes 128 KiB, and gives every
block over 128 KiB its own mapping; it raises both thresholds only when such a block is freed, so where
they end up depends on what the process happened to allocate first. A server that builds the same few
hundred kilobytes for every request (rendered frames, their PNGs, the base64 answer) can then fault those
pages in again on every request: VSI's env worker faults in pages on every step with the defaults and
hardly ever with these thresholds, and Sokoban's did, at a cost in CPU, until its PNG rows were laid out in
one array (`benchmarks/malloc_thresholds.py`; the figures in docs/benchmarks.md, "PNG encoding and the env
worker's memory", and for Sokoban's faults that file's history). Fixed thresholds keep the memory for
the next request, whatever the process allocated first.
"""

from __future__ import annotations

import ctypes

M_TRIM_THRESHOLD = -1  # mallopt parameters, from glibc's <malloc.h>
M_MMAP_THRESHOLD = -3
TRIM_THRESHOLD_BYTES = 32 << 20
"""Free memory at the top of the heap that stays with the process: far above one request's working set."""
MMAP_THRESHOLD_BYTES = 8 << 20
"""Blocks below this come from the heap (glibc caps the threshold at 32 MiB on 64-bit)."""


def keep_freed_memory() -> bool:
    """Fix glibc's trim and mmap thresholds for this process; False where the C library has no
    `mallopt` (not glibc) or refuses them, and the process keeps its defaults."""
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library this process runs on
    except (OSError, AttributeError, TypeError):  # no such symbol; no such handle (Windows)
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    )
