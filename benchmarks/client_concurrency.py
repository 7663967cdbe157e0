"""Client concurrency benchmark: N episodes at once through ONE `AsyncEnvClient` (or one `EnvClient`).

    .venv/bin/python -m benchmarks.client_concurrency [--seconds 10] [--concurrency 1 16 64 256]
        [--client async|blocking]

Starts `vistarl serve tests.envs.counter` (1x1 images, so the server is cheap) and, per row, runs N
episodes on one shared client: reset, then "inc" until done, close, reset again, until time is up.
With `--client blocking` the N episodes are N threads sharing one blocking `EnvClient`; its client CPU
per step at concurrency 1 is the blocking client's own cost per call.
After a warm-up it counts the steps that finish in the measured window and reports steps/s, p50 / p99
latency of `step`, and CPU per step of this process (`time.process_time()`) and of the server process
(from /proc, on Linux). Prints a markdown table.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from benchmarks.harness import (
    LoadFigures,
    add_load_arguments,
    benchmark_parser,
    latency_percentiles_ms,
    markdown_header,
    ms_per_step,
    process_cpu_s,
    served_env,
)
from vistarl.clients.http import AsyncEnvClient, EnvClient, RetryPolicy

EPISODE_OPTIONS = {"target": 100, "image_size": 1}


@dataclass(frozen=True, kw_only=True)
class Figures(LoadFigures):
    """One benchmark row: the episodes run at once, and what the load measured."""

    concurrency: int


@dataclass
class Window:
    """The measured window and what happened in it."""

    start: float
    stop: float
    finished: list[float] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)

    @property
    def steps(self) -> int:
        """Steps that finished in the window."""
        return len(self.finished)

    def record(self, sent: float, done: float) -> None:
        """Count a step that finished in the window, and its latency if it also started there (list
        appends, so that threads can record at once)."""
        if self.start <= done <= self.stop:
            self.finished.append(done)
            if self.start <= sent:
                self.latencies.append(done - sent)


async def play(client: AsyncEnvClient, window: Window) -> None:
    """One episode slot: play counter episodes back to back until the window closes."""
    while time.perf_counter() < window.stop:
        async with client.episode(options=EPISODE_OPTIONS) as ep:
            while not ep.done and (sent := time.perf_counter()) < window.stop:
                await ep.step("inc")
                window.record(sent, time.perf_counter())


def play_blocking(client: EnvClient, window: Window) -> None:
    """`play` in a thread of its own, on a blocking `EnvClient` shared by the threads."""
    while time.perf_counter() < window.stop:
        with client.episode(options=EPISODE_OPTIONS) as ep:
            while not ep.done and (sent := time.perf_counter()) < window.stop:
                ep.step("inc")
                window.record(sent, time.perf_counter())


async def cpu_in_window(window: Window, server_pid: int) -> tuple[float, float | None]:
    """CPU seconds spent by this process and by the server between the window's start and stop."""
    await asyncio.sleep(window.start - time.perf_counter())
    client_start, server_start = time.process_time(), process_cpu_s(server_pid)
    await asyncio.sleep(window.stop - time.perf_counter())
    client_end, server_end = time.process_time(), process_cpu_s(server_pid)
    server = None if server_start is None or server_end is None else server_end - server_start
    return client_end - client_start, server


async def measure(
    url: str, server_pid: int, concurrency: int, seconds: float, warmup: float, blocking: bool
) -> Figures:
    """Run `concurrency` episode slots on one client for warmup + seconds and summarise the window."""
    retry = RetryPolicy(deadline_s=seconds + warmup + 60.0)
    start = time.perf_counter() + warmup
    window = Window(start, start + seconds)
    cpu = asyncio.create_task(cpu_in_window(window, server_pid))
    if blocking:
        loop = asyncio.get_running_loop()
        with (
            EnvClient(url, token="", timeout=60.0, retry=retry) as shared,
            ThreadPoolExecutor(concurrency) as pool,
        ):
            await asyncio.gather(
                *(loop.run_in_executor(pool, play_blocking, shared, window) for _ in range(concurrency))
            )
    else:
        async with AsyncEnvClient(url, token="", timeout=60.0, retry=retry) as client:
            await asyncio.gather(*(play(client, window) for _ in range(concurrency)))
    client_cpu, server_cpu = await cpu
    latencies = sorted(window.latencies)
    p50_ms, p99_ms = latency_percentiles_ms(latencies)
    steps = max(window.steps, 1)
    return Figures(
        concurrency=concurrency,
        steps_per_s=window.steps / seconds,
        cpu_ms_per_step=ms_per_step(server_cpu, steps),
        p50_ms=p50_ms,
        p99_ms=p99_ms,
        client_cpu_ms_per_step=ms_per_step(client_cpu, steps),
    )


def markdown(rows: list[Figures]) -> str:
    """The figures as a markdown table."""
    lines = [
        markdown_header(
            "concurrency", "steps/s", "p50 ms", "p99 ms", "client CPU ms/step", "server CPU ms/step"
        )
    ]
    for r in rows:
        server = "-" if r.cpu_ms_per_step is None else f"{r.cpu_ms_per_step:.2f}"
        cells = [r.concurrency, f"{r.steps_per_s:.0f}", f"{r.p50_ms:.1f}", f"{r.p99_ms:.1f}"]
        lines.append("| " + " | ".join(map(str, [*cells, f"{r.client_cpu_ms_per_step:.2f}", server])) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = benchmark_parser(__doc__)
    add_load_arguments(parser, [1, 16, 64, 256], 2.0, "Unmeasured seconds before each row.")
    parser.add_argument("--client", choices=["async", "blocking"], default="async", help="Which client.")
    args = parser.parse_args()

    with served_env("tests.envs.counter", 2 * max(args.concurrency)) as server:
        blocking = args.client == "blocking"
        rows = [
            asyncio.run(measure(server.url, server.pid, n, args.seconds, args.warmup, blocking))
            for n in args.concurrency
        ]
    print(markdown(rows))


if __name__ == "__main__":
    main()
