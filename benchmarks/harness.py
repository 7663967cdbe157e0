"""What the benchmarks share: their command line, the env server they measure against, the CPU time of a
process read from /proc, and the markdown tables they print."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from vistarl.devtools.model_shapes import REAL_SHAPES
from vistarl.devtools.servers import running_process, vistarl_cmd
from vistarl.httpserver.launch import free_port


def benchmark_parser(doc: str | None) -> argparse.ArgumentParser:
    """A benchmark's argument parser, whose `--help` shows the module docstring as written (command,
    machine, what is counted)."""
    return argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)


def add_shape_argument(parser: argparse.ArgumentParser) -> None:
    """`--shape`: the released model whose shape a GPU benchmark builds (`--tiny` keeps its architecture)."""
    parser.add_argument(
        "--shape",
        choices=sorted(REAL_SHAPES),
        default="qwen2_5_vl_3b",
        help="Qwen2.5-VL-3B or Qwen3-VL-2B (deepstack included), random weights",
    )


def add_window_arguments(
    parser: argparse.ArgumentParser,
    seconds: float,
    warmup_s: float,
    seconds_help: str = "Measured seconds per row.",
    warmup_help: str = "Unmeasured seconds of load first.",
) -> None:
    """`--seconds` and `--warmup`: the measured window of each row and the unmeasured load before it."""
    parser.add_argument("--seconds", type=float, default=seconds, help=seconds_help)
    parser.add_argument("--warmup", type=float, default=warmup_s, help=warmup_help)


def add_load_arguments(
    parser: argparse.ArgumentParser, concurrency: list[int], warmup_s: float, warmup_help: str
) -> None:
    """`--seconds`, `--warmup` and `--concurrency`: the measured window of each row of a load benchmark,
    the unmeasured time before it, and the episodes run at once (one row each)."""
    add_window_arguments(parser, 10.0, warmup_s, warmup_help=warmup_help)
    parser.add_argument("--concurrency", type=int, nargs="+", default=concurrency)


def markdown_header(*columns: str, text: Sequence[str] = ()) -> str:
    """A markdown table's header row and rule: the columns named in `text` aligned left, figures right."""
    rule = "".join("|---" if column in text else "|---:" for column in columns)
    return "| " + " | ".join(columns) + " |\n" + rule + "|"


@dataclass(frozen=True, kw_only=True)
class LoadFigures:
    """What a load benchmark measures of a row: steps/s, the server's CPU and the client's per step, and
    the step latency's median and 99th percentile."""

    steps_per_s: float
    cpu_ms_per_step: float | None
    p50_ms: float | None = None
    p99_ms: float | None = None
    client_cpu_ms_per_step: float | None = None

    @classmethod
    def from_window(
        cls: type[FiguresT],
        latencies: Sequence[float],
        seconds: float,
        server_cpu_s: float | None,
        client_cpu_s: float | None,
        **fields: Any,
    ) -> FiguresT:
        """The figures of a measured window of `seconds` whose steps took `latencies` (seconds each), with
        the CPU seconds the server and the client used in it; `fields` are the row's own."""
        p50_ms, p99_ms = latency_percentiles_ms(latencies)
        steps = len(latencies)
        return cls(
            steps_per_s=steps / seconds,
            cpu_ms_per_step=ms_per_step(server_cpu_s, steps),
            p50_ms=p50_ms,
            p99_ms=p99_ms,
            client_cpu_ms_per_step=ms_per_step(client_cpu_s, steps),
            **fields,
        )


FiguresT = TypeVar("FiguresT", bound=LoadFigures)


def latency_percentiles_ms(latencies: Sequence[float]) -> tuple[float, float]:
    """The median and 99th percentile of step latencies given in seconds, in milliseconds."""
    cuts = statistics.quantiles(latencies, n=100)
    return cuts[49] * 1e3, cuts[98] * 1e3


@dataclass(frozen=True)
class ServedEnv:
    """An env server under measurement: its base URL and its process id."""

    url: str
    pid: int


@contextlib.contextmanager
def served_env(env: str, max_sessions: int, *flags: str) -> Iterator[ServedEnv]:
    """`vistarl serve ENV` on a free loopback port without a bearer token, holding up to `max_sessions`,
    until the block ends."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = vistarl_cmd(
        "serve", env, "--host", "127.0.0.1", "--port", str(port),
        "--max-sessions", str(max_sessions), "--log-level", "warning", *flags,
    )  # fmt: skip
    with running_process(command, ready_url=f"{url}/health", env={"VISTARL_API_TOKEN": ""}) as server:
        yield ServedEnv(url, server.pid)


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of process `pid` from /proc (None where there is no /proc)."""
    fields = _stat_fields(pid)
    if fields is None:
        return None
    ticks = int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15 of proc(5))
    return ticks / os.sysconf("SC_CLK_TCK")


def minor_faults(pid: int) -> int | None:
    """Minor page faults of process `pid` so far, from /proc (None where there is no /proc)."""
    fields = _stat_fields(pid)
    return None if fields is None else int(fields[7])  # minflt (field 10 of proc(5))


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name, from the state on (None without it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def process_tree_cpu_s(pid: int) -> float | None:
    """CPU seconds of process `pid` plus its live descendants (a server and its env workers)."""
    own = process_cpu_s(pid)
    if own is None:
        return None
    return own + sum(process_tree_cpu_s(child) or 0.0 for child in _children(pid))


def _children(pid: int) -> list[int]:
    """The child pids of `pid`, from /proc (empty where there is none)."""
    children: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return children


async def cpu_between(
    pid: int, start: float, stop: float, cpu_s: Callable[[int], float | None]
) -> float | None:
    """CPU seconds (by `cpu_s`) that process `pid` used between two `perf_counter` instants (None without
    /proc)."""
    await asyncio.sleep(start - time.perf_counter())
    before = cpu_s(pid)
    await asyncio.sleep(stop - time.perf_counter())
    after = cpu_s(pid)
    return None if before is None or after is None else after - before


def ms_per_step(cpu_s: float | None, steps: int) -> float | None:
    """CPU milliseconds per step, or None where the CPU time is unknown."""
    return None if cpu_s is None else 1e3 * cpu_s / steps
