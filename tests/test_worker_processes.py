"""Worker processes on a real Redis: SIGKILL recovery, a Redis restart, SIGTERM draining, and the CLIs."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import httpx
import redis
import redis.asyncio as aioredis
from typer.testing import CliRunner, Result

from tests.envs.serving import counter_server
from tests.machine import require
from tests.runners import SETTINGS
from vistarl.cli.main import app
from vistarl.devtools.servers import running_process, vistarl_cmd, wait_http
from vistarl.httpserver.launch import free_port, stop_process
from vistarl.trainer.queue.base import unpack
from vistarl.trainer.queue.consumer import ResultConsumer
from vistarl.trainer.queue.redis import RedisQueue
from vistarl.trainer.rollout.job import EpisodeJob

NOOP_RUNNER = ("--runner", "tests.runners:make_noop_runner")


def job(episode_id: str, **fields: Any) -> EpisodeJob:
    return EpisodeJob(episode_id=episode_id, group_id="g0", env="counter", settings=SETTINGS, **fields)


def namespace() -> str:
    return f"proc-{uuid.uuid4().hex[:10]}"


@contextlib.contextmanager
def worker_processes(
    redis_url: str, ns: str, consumers: list[str], *flags: str
) -> Iterator[list[tuple[subprocess.Popen[bytes], str]]]:
    """`vistarl worker` processes, one per consumer name, started together.

    Yields (process, metrics URL) pairs once every metrics endpoint answers.
    """
    with contextlib.ExitStack() as stack:
        started = []
        for consumer in consumers:
            port = free_port()
            args = vistarl_cmd(
                "worker", "--redis-url", redis_url, "--namespace", ns, "--consumer", consumer,
                "--metrics-port", str(port), *flags,
            )  # fmt: skip
            started.append((stack.enter_context(running_process(args)), f"http://127.0.0.1:{port}/metrics"))
        for proc, metrics_url in started:
            wait_http(metrics_url, timeout=60, proc=proc)
        yield started


@contextlib.contextmanager
def durable_redis() -> Iterator[tuple[str, Callable[[], None]]]:
    """A private redis-server whose AOF is fsynced on every write; yields its URL and a hard restart.

    The restart SIGKILLs the server, leaves the port dead for a moment, and starts it again on the
    same port and data directory, so everything Redis acknowledged before the kill comes back.
    """
    binary = shutil.which("redis-server")
    require(binary is not None, "the restart test needs a redis-server binary (scripts/ensure-redis.sh)")
    assert binary is not None
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    with tempfile.TemporaryDirectory() as workdir:
        args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", workdir, "--save", ""]
        args += ["--appendonly", "yes", "--appendfsync", "always"]

        def start() -> subprocess.Popen[bytes]:
            proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, start_new_session=True)
            _wait_redis(url, proc)
            return proc

        procs = [start()]

        def restart() -> None:
            os.killpg(procs[-1].pid, signal.SIGKILL)
            procs[-1].wait(timeout=10)
            time.sleep(0.5)
            procs.append(start())

        try:
            yield url, restart
        finally:
            stop_process(procs[-1])


def _wait_redis(url: str, proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """Wait until Redis answers PING (after loading its AOF); fail early if the process died."""
    client = redis.Redis.from_url(url, socket_timeout=1.0)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with code {proc.returncode}")
            with contextlib.suppress(redis.ConnectionError):
                if client.ping():
                    return
            time.sleep(0.05)
        raise TimeoutError(f"redis at {url} did not answer within {timeout}s")
    finally:
        client.close()


async def eventually(check: Callable[[], Awaitable[Any]], timeout: float = 20.0) -> Any:
    """Poll `check` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := await check():
            return value
        await asyncio.sleep(0.05)
    raise TimeoutError(f"condition not met within {timeout}s")


async def episodes_held_by(queue: RedisQueue, raw: aioredis.Redis, consumer: str) -> list[str]:
    """The episode ids of the jobs `consumer` holds unacknowledged, read straight from Redis."""
    pending = await raw.xpending_range(queue.keys.jobs, "workers", "-", "+", 100, consumername=consumer)
    episodes = []
    for entry in pending:
        rows: Any = await raw.xrange(queue.keys.jobs, entry["message_id"], entry["message_id"])
        [(_, fields)] = rows
        episodes.append(unpack(fields[b"j"])["episode_id"])
    return episodes


def metric_value(metrics_url: str, name: str) -> float:
    for line in httpx.get(metrics_url, timeout=5).text.splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    raise KeyError(name)


async def test_sigkill_mid_episode_reruns_the_lost_jobs_and_delivers_each_once(redis_url: str) -> None:
    ns = namespace()
    with counter_server() as env_url:
        flags: tuple[str, ...] = (
            "--runner",
            "tests.runners:make_slow_runner",
            "--env-url",
            f"counter={env_url}",
        )
        flags += ("--lease-s", "1.5", "--concurrency", "2")
        with worker_processes(redis_url, ns, ["victim", "survivor"], *flags) as [
            (victim, _),
            (_, survivor_metrics),
        ]:
            async with RedisQueue(redis_url, ns) as queue:
                await eventually(lambda: _workers_are(queue, 2))  # idle, and alive
                raw = aioredis.Redis.from_url(redis_url)
                slow = {"target": 3, "step_delay_s": 0.3}
                await queue.enqueue([job(f"e{i}", options=slow) for i in range(6)])
                await eventually(lambda: episodes_held_by(queue, raw, "victim"))
                await asyncio.sleep(0.3)
                os.killpg(victim.pid, signal.SIGKILL)
                victim.wait(timeout=10)
                killed = await episodes_held_by(queue, raw, "victim")
                lease_ends_ms = await raw.zscore(queue.keys.workers, "victim")  # its last heartbeat's
                await eventually(lambda: _workers_are(queue, 1))
                seconds, micros = await raw.time()
                dropped_ms = seconds * 1000 + micros // 1000
                await raw.aclose()

                results = await ResultConsumer(queue).collect(6, timeout_s=60)
                stats = await queue.stats()
            reclaimed = metric_value(survivor_metrics, "vistarl_worker_episodes_reclaimed_total")

    assert killed
    # Counted after the kill until its lease ran out (in Redis's clock, which the leases use), then not:
    # the lease, not anything else, ends a killed worker's count.
    assert lease_ends_ms is not None and dropped_ms >= lease_ends_ms
    assert sorted(r.episode_id for r in results) == [f"e{i}" for i in range(6)]
    assert {r.episode_id: r.attempt for r in results} == {
        f"e{i}": 2 if f"e{i}" in killed else 1 for i in range(6)
    }
    assert {r.episode_reward for r in results} == {3.0}
    assert reclaimed == len(killed)
    assert (stats.pending, stats.in_flight, stats.results, stats.dead) == (0, 0, 0, 0)


async def test_workers_ride_out_a_redis_restart_and_deliver_every_job_once() -> None:
    ns = namespace()
    with durable_redis() as (url, restart):
        flags = (*NOOP_RUNNER, "--concurrency", "2", "--lease-s", "5")
        with worker_processes(url, ns, ["w1", "w2"], *flags):
            async with RedisQueue(url, ns) as queue:
                await queue.enqueue([job(f"e{i}", options={"sleep_s": 0.1}) for i in range(40)])
                consumer = ResultConsumer(queue)
                before = await consumer.collect(8, timeout_s=30)
                restart()
                after = await consumer.collect(40 - len(before), timeout_s=60)
                stats = await queue.stats()

    episodes = [r.episode_id for r in before + after]
    assert sorted(episodes) == sorted(f"e{i}" for i in range(40))
    assert (stats.pending, stats.in_flight, stats.dead) == (0, 0, 0)


async def test_sigterm_finishes_short_episodes_and_hands_back_long_ones(redis_url: str) -> None:
    ns = namespace()
    flags = (*NOOP_RUNNER, "--concurrency", "2", "--shutdown-grace-s", "1.5")
    with worker_processes(redis_url, ns, ["leaving"], *flags) as [(proc, _)]:
        async with RedisQueue(redis_url, ns) as queue:
            await queue.enqueue(
                [job("short", options={"sleep_s": 0.5}), job("long", options={"sleep_s": 60})]
            )
            await eventually(lambda: _in_flight_is(queue, 2))
            os.killpg(proc.pid, signal.SIGTERM)
            assert proc.wait(timeout=20) == 0

            [result] = await ResultConsumer(queue).collect(1, timeout_s=5)
            stats = await queue.stats()
            [handed_back] = await queue.take("next", 1, 1.0)
            raw = aioredis.Redis.from_url(redis_url)
            consumers = [c["name"] for c in await raw.xinfo_consumers(queue.keys.jobs, "workers")]
            await raw.aclose()

    assert (result.episode_id, result.attempt) == ("short", 1)
    assert (stats.pending, stats.in_flight, stats.workers) == (1, 0, 0)
    assert (handed_back.job.episode_id, handed_back.job.attempt, handed_back.job.errors) == ("long", 1, [])
    assert b"leaving" not in consumers


async def _in_flight_is(queue: RedisQueue, count: int) -> bool:
    return (await queue.stats()).in_flight == count


async def _workers_are(queue: RedisQueue, count: int) -> bool:
    return (await queue.stats()).workers == count


def test_queue_cli_reports_stats_and_requeues_dead_letters(redis_url: str) -> None:
    ns = namespace()

    async def setup() -> None:
        async with RedisQueue(redis_url, ns, max_attempts=1) as queue:
            await queue.enqueue([job("doomed"), job("running"), job("waiting")])
            doomed, _ = await queue.take("w1", 2, 1.0)
            await queue.fail(doomed, "ValueError: the env rejected the seed")

    asyncio.run(setup())
    where = ("--redis-url", redis_url, "--namespace", ns)

    def queue_cli(*args: str) -> Result:
        return CliRunner().invoke(app, ["queue", *args, *where])

    stats = queue_cli("stats", "--json")
    assert stats.exit_code == 0, stats.output
    counts = json.loads(stats.stdout)
    assert {k: counts[k] for k in ("pending", "in_flight", "dead", "results")} == {
        "pending": 1,
        "in_flight": 1,
        "dead": 1,
        "results": 0,
    }
    table = queue_cli("stats")
    assert table.exit_code == 0 and "in_flight" in table.stdout

    [letter] = json.loads(queue_cli("dlq", "--json").stdout)
    assert (letter["episode_id"], letter["attempts"]) == ("doomed", 1)
    assert letter["error"] == "ValueError: the env rejected the seed"
    assert "doomed" in queue_cli("dlq").stdout

    unknown = queue_cli("dlq", "--requeue", "1-1")
    assert unknown.exit_code == 1 and "1-1" in unknown.stderr
    requeued = queue_cli("dlq", "--requeue", "all")
    assert requeued.exit_code == 0 and "requeued 1" in requeued.stdout
    after = json.loads(queue_cli("stats", "--json").stdout)
    assert (after["pending"], after["dead"]) == (2, 0)

    unreachable = CliRunner().invoke(app, ["queue", "stats", "--redis-url", "redis://127.0.0.1:1/0"])
    assert unreachable.exit_code == 1 and "unavailable" in unreachable.stderr


def test_worker_cli_rejects_bad_flags_clearly() -> None:
    def worker_cli(*flags: str) -> Result:
        return CliRunner().invoke(app, ["worker", "--redis-url", "redis://127.0.0.1:1/0", *flags])

    no_engine = worker_cli()
    assert no_engine.exit_code == 2 and "--engine" in no_engine.stderr
    bad_engine = worker_cli("--engine", "vllm:http://x")
    assert bad_engine.exit_code == 2 and "is not hf:DIR" in bad_engine.stderr
    bad_env = worker_cli(*NOOP_RUNNER, "--env-url", "nourl")
    assert bad_env.exit_code == 2 and "NAME=URL" in bad_env.stderr
    bad_runner = worker_cli("--runner", "no.such.module:make")
    assert bad_runner.exit_code == 2 and "cannot import" in bad_runner.stderr
    bad_namespace = worker_cli(*NOOP_RUNNER, "--namespace", "two words")
    assert bad_namespace.exit_code == 2 and "namespace" in bad_namespace.stderr
    no_tokenizer = worker_cli(*NOOP_RUNNER, "--tokenizer", "/no/such/checkpoint")
    assert no_tokenizer.exit_code == 2 and "/no/such/checkpoint" in no_tokenizer.stderr
    no_take = worker_cli(*NOOP_RUNNER, "--take-max", "0")
    assert no_take.exit_code == 2 and "--take-max" in no_take.stderr
