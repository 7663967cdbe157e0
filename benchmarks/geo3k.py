"""Geo3k benchmark: grading latency, the in-process floor, and server steps/s at 64 concurrent sessions.

    .venv/bin/python -m benchmarks.geo3k [--seconds 10] [--concurrency 64] [--env-workers 0 2] [--problems N]

The answers are realistic: for generated problems, the answer itself, the same value as a decimal
(6 places), and a wrong answer (another choice, else the answer plus one).
(a) Grading, each answer graded once: p50 / p99 latency of `GraderPool.grade` (a grading process
    over a pipe, the env's path) and of `answers_match` in this process (math-verify alone); the
    difference is what the bounded-time grading process costs. Start-up is outside the figures.
(b) In process (the floor): `Geo3kEnv` episodes one after another: generate + render + PNG encode at
    reset, then three graded turns (a tool call with a wrong or right answer, a right one, the boxed
    answer). Steps per second, resets included in the time; its CPU column counts this process and
    its grading processes. Each step waits for a grading process, so on a busy machine this row
    measures scheduling delays as much as work: its CPU time per step is the steadier figure.
(c) Over HTTP, as benchmarks/env_server.py (which see for the columns): a `vistarl serve geo3k
    --env-workers W` process and N virtual users on one `AsyncEnvClient`, each playing those
    episodes back to back, reset by seed. Steps are the /step calls; grading processes count as the
    server's CPU.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import os
import statistics
import time
from collections.abc import Callable, Iterator

from benchmarks.env_server import Figures, markdown, over_http, serving
from benchmarks.episodes import Task, tasks
from benchmarks.harness import (
    add_load_arguments,
    benchmark_parser,
    latency_percentiles_ms,
    markdown_header,
    process_tree_cpu_s,
)
from vistarl.clients.http import AsyncEnvClient
from vistarl.clients.images import encode_image
from vistarl.services.geo3k import Geo3kEnv
from vistarl.services.geo3k.equivalence import answers_match
from vistarl.services.geo3k.grader import GraderPool, Verdict

GRADE_TIMEOUT_S = 5.0


def grading_latency(all_tasks: list[Task]) -> list[str]:
    """Markdown rows: latency of the grading process and of math-verify in process, per answer."""
    pairs = [(answer, t.reference) for t in all_tasks for answer in (t.reference, t.decimal, t.wrong)]
    pool = GraderPool(max_workers=1)
    pool.grade("1", "1", 60.0)
    try:
        direct = _timed(pairs, answers_match)
        through = _timed(pairs, lambda answer, reference: pool.grade(answer, reference, GRADE_TIMEOUT_S))
    finally:
        pool.close()
    timeouts = sum(verdict is Verdict.TIMEOUT for verdict, _ in through)
    rows = [
        markdown_header(
            "grading", "answers", "p50 ms", "p99 ms", "mean ms", "max ms", "timeouts", text=("grading",)
        )
    ]
    for name, results, counted in (("grading process", through, timeouts), ("in process", direct, 0)):
        latencies = [seconds for _, seconds in results]
        p50_ms, p99_ms = latency_percentiles_ms(latencies)
        mean_ms, max_ms = 1e3 * statistics.fmean(latencies), 1e3 * max(latencies)
        cells = [
            name,
            len(latencies),
            f"{p50_ms:.2f}",
            f"{p99_ms:.2f}",
            f"{mean_ms:.2f}",
            f"{max_ms:.1f}",
            counted,
        ]
        rows.append("| " + " | ".join(map(str, cells)) + " |")
    return rows


def _timed(pairs: list[tuple[str, str]], grade: Callable[[str, str], object]) -> list[tuple[object, float]]:
    results = []
    for answer, reference in pairs:
        started = time.perf_counter()
        results.append((grade(answer, reference), time.perf_counter() - started))
    return results


def in_process(all_tasks: list[Task], seconds: float) -> Figures:
    """Play episodes in this process for `seconds` (resets with their PNG encoding included)."""
    steps = 0
    started, cpu_started = time.perf_counter(), process_tree_cpu_s(os.getpid())
    for index, task in enumerate(itertools.cycle(all_tasks)):
        if time.perf_counter() - started >= seconds:
            break
        env = Geo3kEnv(seed=task.seed)
        obs, _ = env.reset()
        for image in obs["images"]:
            encode_image(image)
        for response in task.turns(first_right=index % 2 == 0):
            steps += 1
            if env.step(response).done:
                break
    cpu_ended = process_tree_cpu_s(os.getpid())
    cpu_ms = None if cpu_started is None or cpu_ended is None else 1e3 * (cpu_ended - cpu_started) / steps
    return Figures(
        mode="in-process", steps_per_s=steps / (time.perf_counter() - started), cpu_ms_per_step=cpu_ms
    )


async def geo3k_user(
    next_task: Iterator[tuple[int, Task]], client: AsyncEnvClient, measure_from: float, stop_at: float
) -> list[float]:
    """One virtual user: episodes of the next tasks until `stop_at`; its step latencies after the warm-up."""
    latencies: list[float] = []
    while time.perf_counter() < stop_at:
        index, task = next(next_task)
        async with client.episode(seed=task.seed) as episode:
            for response in task.turns(first_right=index % 2 == 0):
                if episode.done or (sent := time.perf_counter()) >= stop_at:
                    break
                await episode.step(response)
                finished = time.perf_counter()
                if measure_from <= sent and finished <= stop_at:
                    latencies.append(finished - sent)
    return latencies


def main() -> None:
    parser = benchmark_parser(__doc__)
    add_load_arguments(parser, [64], 3.0, "Unmeasured seconds before each HTTP row.")
    parser.add_argument("--env-workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--problems", type=int, default=200, help="Generated problems the answers come from.")
    args = parser.parse_args()

    all_tasks = tasks(args.problems)
    print("\n".join(grading_latency(all_tasks)), end="\n\n", flush=True)
    rows = [in_process(all_tasks, args.seconds)]
    for env_workers in args.env_workers:
        with serving(env_workers, "memory", 2 * max(args.concurrency), env="geo3k") as server:
            for concurrency in args.concurrency:
                user = functools.partial(geo3k_user, enumerate(itertools.cycle(all_tasks)))
                setting = (env_workers, "memory")
                figures = over_http(server, setting, concurrency, args.seconds, args.warmup, user)
                rows.append(asyncio.run(figures))
    print(markdown(rows, rows[0].steps_per_s))


if __name__ == "__main__":
    main()
