"""Queue throughput and latency: enqueue -> worker -> publish + ack -> consume, with a no-op episode.

Starts a private redis-server and real `vistarl worker` processes running the no-op runner
(`tests.runners:make_noop_runner`), then, for 1 and 2 worker processes:
- a saturated run: `--jobs` jobs pushed through as fast as they go, at most `--max-in-flight` queued
  at a time; prints episodes/s, end-to-end latency p50/p99 (queueing included), and the CPU time
  per episode of the worker processes, of redis-server and of the trainer side (this process:
  enqueue and consume), read from /proc, which barely depends on what else the machine runs;
- a paced run: jobs enqueued at `--paced-rate` per second, well under capacity; prints latency p50/p99,
  the time one episode spends in the pipeline when nothing waits.
The trainer side collects with `collect(256, timeout_s=0.01)`, so latencies include up to 10 ms of
that collect window.

    .venv/bin/python -m benchmarks.queue [--jobs 20000] [--workers 1,2]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import redis

from benchmarks.harness import benchmark_parser, markdown_header
from vistarl.devtools.servers import redis_server, running_process, vistarl_cmd
from vistarl.httpserver.launch import free_port
from vistarl.trainer.config import RolloutConfig
from vistarl.trainer.queue.base import EpisodeQueue
from vistarl.trainer.queue.consumer import ResultConsumer
from vistarl.trainer.queue.redis import RedisQueue
from vistarl.trainer.rollout.job import EpisodeJob, EpisodeSettings


@dataclass
class Run:
    """The figures of one worker count."""

    throughput: float
    loaded: list[float]
    paced: list[float]
    cpu_us: dict[str, float]


@contextlib.contextmanager
def workers(redis_url: str, namespace: str, count: int, concurrency: int) -> Iterator[list[int]]:
    """`count` real worker processes with the no-op runner; yields their pids once their metrics answer."""
    with contextlib.ExitStack() as stack:
        pids = []
        for index in range(count):
            port = free_port()
            args = vistarl_cmd(
                "worker", "--redis-url", redis_url, "--namespace", namespace, "--consumer", f"bench-{index}",
                "--runner", "tests.runners:make_noop_runner", "--concurrency", str(concurrency),
                "--metrics-port", str(port), "--log-level", "WARNING",
            )  # fmt: skip
            pids.append(
                stack.enter_context(running_process(args, ready_url=f"http://127.0.0.1:{port}/metrics")).pid
            )
        yield pids


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far, from /proc."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def jobs(prefix: str, count: int) -> list[EpisodeJob]:
    """`count` jobs in groups of 8, each with the settings a run's default config gives (as the trainer's
    jobs carry theirs)."""
    settings = EpisodeSettings.of(RolloutConfig())
    return [
        EpisodeJob(episode_id=f"{prefix}-{i}", group_id=f"{prefix}-{i // 8}", env="noop", settings=settings)
        for i in range(count)
    ]


async def produce(queue: EpisodeQueue, batch: list[EpisodeJob], max_in_flight: int, chunk: int = 64) -> None:
    """Enqueue in chunks, each stamped with its enqueue time (echoed back in the trajectory's options)."""
    for start in range(0, len(batch), chunk):
        stamp = time.time()
        part = [job.model_copy(update={"options": {"t": stamp}}) for job in batch[start : start + chunk]]
        await queue.enqueue(part, max_in_flight=max_in_flight, timeout_s=120)


async def consume(consumer: ResultConsumer, count: int, timeout_s: float) -> list[float]:
    """Collect `count` trajectories in calls of `collect(256, 0.01)`; returns each one's latency (s)."""
    latencies: list[float] = []
    deadline = time.monotonic() + timeout_s
    while len(latencies) < count and time.monotonic() < deadline:
        for trajectory in await consumer.collect(min(256, count - len(latencies)), timeout_s=0.01):
            latencies.append(time.time() - trajectory.metrics["t"])
    if len(latencies) < count:
        raise TimeoutError(f"only {len(latencies)} of {count} trajectories arrived")
    return latencies


async def saturated(queue: EpisodeQueue, count: int, max_in_flight: int) -> tuple[float, list[float]]:
    """Push `count` jobs through as fast as the workers go; returns (episodes/s, latencies)."""
    started = time.perf_counter()
    producer = asyncio.create_task(produce(queue, jobs(uuid.uuid4().hex[:6], count), max_in_flight))
    latencies = await consume(ResultConsumer(queue), count, timeout_s=300)
    await producer
    return count / (time.perf_counter() - started), latencies


async def paced(queue: EpisodeQueue, count: int, rate: float) -> list[float]:
    """Enqueue one job every 1/rate seconds; returns latencies."""
    collector = asyncio.create_task(consume(ResultConsumer(queue), count, timeout_s=60 + count / rate))
    start = time.perf_counter()
    for index, job in enumerate(jobs(uuid.uuid4().hex[:6], count)):
        await asyncio.sleep(max(0.0, start + index / rate - time.perf_counter()))
        await queue.enqueue([job.model_copy(update={"options": {"t": time.time()}})])
    return await collector


async def bench(redis_url: str, namespace: str, worker_pids: list[int], args: argparse.Namespace) -> Run:
    """Warm up, then a saturated run (timed, with CPU per episode) and a paced run."""
    async with RedisQueue(redis_url, namespace) as queue:
        await saturated(queue, min(2000, args.jobs), args.max_in_flight)
        with redis.Redis.from_url(redis_url) as client:
            redis_pid = int(client.info("server")["process_id"])
        pids = {"workers": worker_pids, "redis": [redis_pid]}
        before = {name: sum(cpu_seconds(p) for p in group) for name, group in pids.items()}
        trainer_before = time.process_time()
        throughput, loaded = await saturated(queue, args.jobs, args.max_in_flight)
        cpu = {name: sum(cpu_seconds(p) for p in group) - before[name] for name, group in pids.items()}
        cpu["trainer side"] = time.process_time() - trainer_before
        light = await paced(queue, args.paced_jobs, args.paced_rate)
    return Run(throughput, loaded, light, {name: 1e6 * s / args.jobs for name, s in cpu.items()})


def percentile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else values[0]


def main() -> None:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--workers", default="1,2", help="comma-separated worker process counts")
    parser.add_argument("--concurrency", type=int, default=256, help="episodes held per worker")
    parser.add_argument("--max-in-flight", type=int, default=1024)
    parser.add_argument("--paced-jobs", type=int, default=1000)
    parser.add_argument("--paced-rate", type=float, default=200.0)
    args = parser.parse_args()

    paced_at = f"{args.paced_rate:g}/s"
    columns = ["worker processes", "episodes/s", "p50 ms (saturated)", "p99 ms (saturated)"]
    columns += [f"p50 ms ({paced_at})", f"p99 ms ({paced_at})"]
    columns += ["CPU µs/episode: workers", "redis", "trainer side"]
    print(markdown_header(*columns))
    with redis_server() as redis_url:
        for count in (int(n) for n in args.workers.split(",")):
            namespace = f"bench-{uuid.uuid4().hex[:8]}"
            with workers(redis_url, namespace, count, args.concurrency) as pids:
                run = asyncio.run(bench(redis_url, namespace, pids, args))
            cells = [str(count), f"{run.throughput:,.0f}"]
            cells += [
                f"{1000 * percentile(values, q):.1f}" for values in (run.loaded, run.paced) for q in (50, 99)
            ]
            cells += [f"{run.cpu_us[name]:.0f}" for name in ("workers", "redis", "trainer side")]
            print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
