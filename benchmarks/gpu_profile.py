"""Where a GPU step spends its time: op tables, and which host code the GPU sat idle behind.

    profile_step(fn, device, out_dir, "update")

runs `fn` once under torch.profiler and writes, to `out_dir`:
- `<name>_ops.txt`: the op table, sorted by device time (by CPU time on the CPU);
- `<name>_idle.txt` (CUDA only): the step's wall time, the time some kernel or copy was running, and
  every idle stretch of the device charged to the innermost host op running when it began, summed by
  op name and by the `record_function` region around it. A sync (`aten::item`, `cudaStreamSynchronize`)
  or slow Python at the top of that list is what keeps the GPU waiting.
"""

from __future__ import annotations

import itertools
import json
import os
import tempfile
import traceback
import warnings
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
HOST_CATEGORIES = ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver", "python_function")
REGION_PREFIX = "region:"
MIN_GAP_US = 5.0


@dataclass(frozen=True)
class Span:
    """One host event: [start, end) in µs on one thread."""

    start: float
    end: float
    name: str
    thread: int


def profile_step(fn: Callable[[], None], device: torch.device, out_dir: Path, name: str) -> None:
    """Run `fn` once under the profiler; write its op table and, on CUDA, its idle report."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    cuda = device.type == "cuda"
    if cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as profiler:
        fn()
        if cuda:
            torch.cuda.synchronize(device)
    out_dir.mkdir(parents=True, exist_ok=True)
    sort_by = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    table = profiler.key_averages().table(sort_by=sort_by, row_limit=60, max_name_column_width=70)
    (out_dir / f"{name}_ops.txt").write_text(table)
    if cuda:
        (out_dir / f"{name}_idle.txt").write_text(profiled_idle_report(profiler))


def profiled_idle_report(profiler: torch.profiler.profile) -> str:
    """`idle_report` of a finished profiler's CUDA trace."""
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.json"
        profiler.export_chrome_trace(str(trace))
        return idle_report(json.loads(trace.read_text())["traceEvents"])


def sync_report(fn: Callable[[], None], out_path: Path) -> None:
    """Run `fn` with CUDA's sync debug mode on; write each host sync's call site, most frequent first.

    A call site is the innermost frame outside torch, then the frame that made the synchronizing call.
    Syncs raised on the autograd engine's thread (checkpoint recomputation) print to stderr instead.
    """
    sites: Counter[str] = Counter()

    def record(*_: object, **__: object) -> None:
        sites[_call_site(traceback.extract_stack()[:-2])] += 1

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    lines = [
        f"{sum(sites.values())} synchronizing calls",
        *(f"{n:6d}  {site}" for site, n in sites.most_common()),
    ]
    out_path.write_text("\n".join(lines) + "\n")


def _call_site(stack: traceback.StackSummary) -> str:
    """`outside-torch file:line (function) -> innermost file:line` of a synchronizing call."""
    innermost = stack[-1]
    outside = [frame for frame in stack if f"{os.sep}torch{os.sep}" not in frame.filename] or [innermost]
    caller = outside[-1]
    return (
        f"{caller.filename}:{caller.lineno} ({caller.name}) -> "
        f"{Path(innermost.filename).name}:{innermost.lineno} ({innermost.name})"
    )


def compile_report(out_path: Path) -> None:
    """What torch.compile did in this process: frames compiled, graph breaks and recompilations by reason."""
    from torch._dynamo.utils import counters

    lines = []
    for section in ("frames", "stats", "graph_break", "recompiles"):
        lines.append(f"{section}:")
        lines += [f"  {count:6d}  {str(key)[:150]}" for key, count in counters[section].most_common(25)]
    out_path.write_text("\n".join(lines) + "\n")


def idle_report(events: list[dict]) -> str:
    """The text of `<name>_idle.txt` from a chrome trace's events."""
    device = _merged(
        (e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") in DEVICE_CATEGORIES and "dur" in e
    )
    host = [
        Span(float(e["ts"]), float(e["ts"] + e["dur"]), str(e["name"]), int(e["tid"]))
        for e in events
        if e.get("cat") in HOST_CATEGORIES and e.get("ph") == "X" and "dur" in e
    ]
    if not device or not host:
        return "no device or host events recorded\n"
    start, end = min(s.start for s in host), max(max(s.end for s in host), device[-1][1])
    busy = sum(b - a for a, b in device)
    gaps = _gaps(device, start, end)
    by_op: defaultdict[str, float] = defaultdict(float)
    by_region: defaultdict[str, float] = defaultdict(float)
    by_part: defaultdict[str, float] = defaultdict(float)
    points = [a for a, _ in gaps]
    ops = _innermost([s for s in host if not s.name.startswith(REGION_PREFIX)], points)
    regions = _innermost([s for s in host if s.name.startswith(REGION_PREFIX)], points)
    parts = _model_parts([s for s in host if s.name.startswith("FSDP::")], points)
    for (gap_start, gap_end), op, region, part in zip(gaps, ops, regions, parts, strict=True):
        by_op[op] += gap_end - gap_start
        by_region[region] += gap_end - gap_start
        by_part[part] += gap_end - gap_start
    idle = sum(b - a for a, b in gaps)
    lines = [
        f"wall {1e-3 * (end - start):.1f} ms, device busy {1e-3 * busy:.1f} ms "
        f"({busy / (end - start):.1%}), idle {1e-3 * idle:.1f} ms in {len(gaps)} gaps over {MIN_GAP_US} us",
        "",
        "idle ms by region:",
        *_largest(by_region, 30),
        "",
        "idle ms by the part of the model whose FSDP hook ran last before the gap:",
        *_largest(by_part, 10),
        "",
        "idle ms by the innermost host op running when the gap began:",
        *_largest(by_op, 40),
    ]
    return "\n".join(lines) + "\n"


def _largest(totals: dict[str, float], count: int) -> list[str]:
    ranked = sorted(totals.items(), key=lambda item: -item[1])[:count]
    return [f"  {1e-3 * us:9.1f}  {name}" for name, us in ranked]


def _model_parts(hooks: list[Span], points: list[float]) -> list[str]:
    """For each sorted instant, the part of the model (vision, decoder, root) of the last FSDP hook begun."""
    hooks = sorted(hooks, key=lambda s: s.start)
    parts, i, current = [], 0, "(before any FSDP hook)"
    for t in points:
        while i < len(hooks) and hooks[i].start <= t:
            name = hooks[i].name
            current = "vision" if ".visual." in name else "decoder" if ".layers." in name else "root/other"
            current = f"{current}: {name.split(' ')[0]}"
            i += 1
        parts.append(current)
    return parts


def _merged(intervals: object) -> list[tuple[float, float]]:
    """Sorted, overlapping intervals merged into disjoint ones."""
    merged: list[tuple[float, float]] = []
    for a, b in sorted(intervals):  # type: ignore[call-overload]
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def _gaps(busy: list[tuple[float, float]], start: float, end: float) -> list[tuple[float, float]]:
    """The stretches of [start, end) outside `busy` longer than `MIN_GAP_US`."""
    edges = [(start, busy[0][0])]
    edges += [(a[1], b[0]) for a, b in itertools.pairwise(busy)]
    edges.append((busy[-1][1], end))
    return [(a, b) for a, b in edges if b - a > MIN_GAP_US]


def _innermost(spans: list[Span], points: list[float]) -> list[str]:
    """For each sorted instant, the innermost span running then: of each thread's deepest span, the latest
    begun (the autograd engine runs backward on a thread of its own). One sweep per thread."""
    best: list[tuple[float, str]] = [(-1.0, "(no host op)")] * len(points)
    threads: dict[int, list[Span]] = {}
    for span in spans:
        threads.setdefault(span.thread, []).append(span)
    for thread_spans in threads.values():
        thread_spans.sort(key=lambda s: (s.start, -s.end))
        stack: list[Span] = []
        i = 0
        for k, t in enumerate(points):
            while i < len(thread_spans) and thread_spans[i].start <= t:
                while stack and stack[-1].end <= thread_spans[i].start:
                    stack.pop()
                stack.append(thread_spans[i])
                i += 1
            while stack and stack[-1].end <= t:
                stack.pop()
            if stack and stack[-1].start > best[k][0]:
                best[k] = (stack[-1].start, stack[-1].name)
    return [name for _, name in best]
