"""Rollout workers in process, on both queue backends: concurrency, retries, leases, shutdown, metrics."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis
from prometheus_client import generate_latest

from tests.runners import scripted_episode, trajectory_for
from tests.test_queue import QueueMaker, job, make_queue
from vistarl.trainer.queue.base import EpisodeQueue
from vistarl.trainer.queue.consumer import ResultConsumer
from vistarl.trainer.queue.redis import RedisQueue
from vistarl.trainer.queue.worker import EpisodeRunner, Worker, load_runner_factory
from vistarl.trainer.rollout.engines.spec import EngineSpec
from vistarl.trainer.rollout.job import EpisodeJob
from vistarl.trainer.rollout.trajectory import Status, Trajectory

# `make_queue` is the backend-parametrized fixture of test_queue, used here too.
__all__ = ["make_queue"]


@contextlib.asynccontextmanager
async def running(worker: Worker) -> AsyncIterator[Worker]:
    """Run `worker` in the background; stop it (bounded) on the way out."""
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        yield worker
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=30)


def worker_on(queue: EpisodeQueue, runner: EpisodeRunner = scripted_episode, **options: Any) -> Worker:
    return Worker(queue, runner, **{"consumer": "w1", "concurrency": 4, "shutdown_grace_s": 5.0, **options})


def metric(worker: Worker, name: str) -> float:
    """The current value of one of the worker's metrics, read from its Prometheus exposition."""
    for line in generate_latest(worker.metrics.registry).decode().splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    raise KeyError(name)


async def test_worker_runs_jobs_and_publishes_every_trajectory(make_queue: QueueMaker) -> None:
    queue = make_queue()
    await queue.enqueue([job(f"e{i}", options={"i": i}) for i in range(20)])
    async with running(worker_on(queue)) as worker:
        results = await ResultConsumer(queue).collect(20, timeout_s=10)
    assert sorted(r.metrics["i"] for r in results) == list(range(20))
    assert {r.attempt for r in results} == {1}
    assert metric(worker, "vistarl_worker_episodes_done_total") == 20
    assert metric(worker, "vistarl_worker_episode_seconds_count") == 20
    stats = await queue.stats()
    assert (stats.pending, stats.in_flight, stats.results) == (0, 0, 0)


async def test_worker_holds_at_most_its_concurrency(make_queue: QueueMaker) -> None:
    queue = make_queue()
    now_running, most = 0, 0

    async def counting(episode: EpisodeJob) -> Trajectory:
        nonlocal now_running, most
        now_running += 1
        most = max(most, now_running)
        await asyncio.sleep(0.1)
        now_running -= 1
        return trajectory_for(episode)

    await queue.enqueue([job(f"e{i}") for i in range(12)])
    async with running(worker_on(queue, counting, concurrency=3)):
        assert len(await ResultConsumer(queue).collect(12, timeout_s=10)) == 12
    assert most == 3


async def test_poison_job_is_dead_lettered_with_its_error(make_queue: QueueMaker) -> None:
    queue = make_queue(max_attempts=3)
    await queue.enqueue([job("poison", options={"raise": "env exploded"}), job("fine")])
    async with running(worker_on(queue)) as worker:
        [result] = await ResultConsumer(queue).collect(1, timeout_s=10)
        deadline = time.monotonic() + 10
        while not await queue.dead_letters() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    assert result.episode_id == "fine"
    [letter] = await queue.dead_letters()
    assert (letter.episode_id, letter.attempts) == ("poison", 3)
    assert letter.error.startswith("RuntimeError: env exploded [worker w1]")
    assert len(letter.job["errors"]) == 3
    assert metric(worker, "vistarl_worker_episodes_failed_total") == 3
    assert metric(worker, "vistarl_worker_episodes_dead_lettered_total") == 1


async def test_a_failed_trajectory_is_delivered_not_retried(make_queue: QueueMaker) -> None:
    queue = make_queue()

    async def gives_up(episode: EpisodeJob) -> Trajectory:
        return trajectory_for(episode, status=Status.FAILED, error="env said no")

    await queue.enqueue([job("a")])
    async with running(worker_on(queue, gives_up)):
        [result] = await ResultConsumer(queue).collect(1, timeout_s=10)
    assert (result.status, result.error, result.attempt) == (Status.FAILED, "env said no", 1)
    assert (await queue.stats()).dead == 0


async def test_an_invalid_trajectory_fails_the_attempt_with_a_clear_error(make_queue: QueueMaker) -> None:
    queue = make_queue(max_attempts=1)

    async def sloppy(episode: EpisodeJob) -> Any:
        if episode.episode_id == "a":
            return {"episode_id": episode.episode_id}
        return trajectory_for(job("someone-else"))

    await queue.enqueue([job("a"), job("b")])
    async with running(worker_on(queue, sloppy)):
        deadline = time.monotonic() + 10
        while len(await queue.dead_letters()) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    letters = {letter.episode_id: letter.error for letter in await queue.dead_letters()}
    assert "must return a Trajectory, got dict" in letters["a"]
    assert "episode_id 'someone-else' != job's 'b'" in letters["b"]


async def test_heartbeats_keep_a_long_episode_while_another_worker_polls(make_queue: QueueMaker) -> None:
    lease_s = 1.0
    queue = make_queue(lease_s=lease_s)
    await queue.enqueue([job("long", options={"sleep_s": 3 * lease_s})])
    async with running(worker_on(queue, consumer="owner")) as owner:
        while (await queue.stats()).in_flight == 0:
            await asyncio.sleep(0.02)
        async with running(worker_on(make_queue(lease_s=lease_s), consumer="poller")) as poller:
            [result] = await ResultConsumer(queue).collect(1, timeout_s=15)
    assert result.attempt == 1
    assert metric(poller, "vistarl_worker_episodes_reclaimed_total") == 0
    assert metric(owner, "vistarl_worker_episodes_lost_total") == 0


async def test_jobs_of_a_vanished_worker_are_rerun_as_attempt_two(
    make_queue: QueueMaker, caplog: pytest.LogCaptureFixture
) -> None:
    queue = make_queue(lease_s=0.5)
    await queue.enqueue([job("a"), job("b")])
    assert len(await queue.take("vanished", 2, 0.5)) == 2
    with caplog.at_level(logging.INFO, logger="vistarl.trainer.queue.worker"):
        async with running(worker_on(queue)) as worker:
            results = await ResultConsumer(queue).collect(2, timeout_s=10)
    assert sorted((r.episode_id, r.attempt) for r in results) == [("a", 2), ("b", 2)]
    assert metric(worker, "vistarl_worker_episodes_reclaimed_total") == 2
    [reclaim] = [r for r in caplog.records if "reclaimed" in r.getMessage()]
    assert reclaim.levelno == logging.INFO and reclaim.getMessage().endswith(": 2 from vanished")


async def test_a_step_spreads_over_the_idle_workers(redis_url: str) -> None:
    namespace = f"spread-{uuid.uuid4().hex[:10]}"
    ran: dict[str, list[str]] = {"w1": [], "w2": []}

    def recording(name: str) -> EpisodeRunner:
        async def run(episode: EpisodeJob) -> Trajectory:
            ran[name].append(episode.episode_id)
            await asyncio.sleep(0.2)
            return trajectory_for(episode)

        return run

    async with contextlib.AsyncExitStack() as stack:
        queues = [await stack.enter_async_context(RedisQueue(redis_url, namespace)) for _ in ran]
        for queue, name in zip(queues, ran, strict=True):
            await stack.enter_async_context(
                running(worker_on(queue, recording(name), consumer=name, concurrency=16))
            )
        await _blocked_readers(redis_url, 2)
        await queues[0].enqueue([job(f"e{i}") for i in range(8)])
        results = await ResultConsumer(queues[0]).collect(8, timeout_s=10)

    assert sorted(r.episode_id for r in results) == sorted(ran["w1"] + ran["w2"])
    assert len(results) == 8
    assert ran["w1"] and ran["w2"], f"one worker took the whole step: {ran}"


async def _blocked_readers(redis_url: str, count: int, timeout_s: float = 10.0) -> None:
    """Wait until `count` clients of the Redis wait in a blocking XREADGROUP (idle workers)."""
    raw = aioredis.Redis.from_url(redis_url)
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            clients = await raw.client_list()
            if sum(1 for c in clients if c["cmd"] == "xreadgroup" and "b" in c["flags"]) >= count:
                return
            await asyncio.sleep(0.02)
    finally:
        await raw.aclose()
    raise TimeoutError(f"{count} workers did not wait on the queue within {timeout_s} s")


async def test_a_lost_lease_cancels_the_episode_and_the_job_runs_again(make_queue: QueueMaker) -> None:
    queue = make_queue(lease_s=0.6)
    starts = 0

    async def slow_first_time(episode: EpisodeJob) -> Trajectory:
        nonlocal starts
        starts += 1
        await asyncio.sleep(30 if starts == 1 else 0)
        return trajectory_for(episode)

    await queue.enqueue([job("a")])
    async with running(worker_on(queue, slow_first_time)) as worker:
        while not worker._held:
            await asyncio.sleep(0.02)
        await make_queue().release(list(worker._held.values()))
        deadline = time.monotonic() + 10
        while metric(worker, "vistarl_worker_episodes_lost_total") == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        [result] = await ResultConsumer(queue).collect(1, timeout_s=10)
    assert (result.attempt, starts) == (1, 2)
    assert metric(worker, "vistarl_worker_episodes_lost_total") == 1


async def test_stop_finishes_short_episodes_and_hands_back_long_ones(make_queue: QueueMaker) -> None:
    queue = make_queue()
    await queue.enqueue([job("short", options={"sleep_s": 0.3}), job("long", options={"sleep_s": 60})])
    worker = worker_on(queue, shutdown_grace_s=1.0)
    async with running(worker):
        while (await queue.stats()).in_flight < 2:
            await asyncio.sleep(0.02)
    stats = await queue.stats()
    assert (stats.pending, stats.in_flight, stats.results) == (1, 0, 1)
    [result] = await ResultConsumer(queue).collect(1, timeout_s=1)
    assert result.episode_id == "short"
    [handed_back] = await queue.take("next", 1, 0.5)
    assert (handed_back.job.episode_id, handed_back.job.attempt, handed_back.job.errors) == ("long", 1, [])
    assert metric(worker, "vistarl_worker_episodes_released_total") == 1


def test_engine_specs_and_runner_paths_are_checked() -> None:
    assert EngineSpec.parse("sglang:http://127.0.0.1:30000") == EngineSpec(
        kind="sglang", target="http://127.0.0.1:30000"
    )
    assert EngineSpec.parse("hf:/models/tiny").target == "/models/tiny"
    for bad in ("vllm:http://x", "sglang:", "no-colon"):
        with pytest.raises(ValueError, match="hf:DIR, hf:http://host:port or sglang:http://host:port"):
            EngineSpec.parse(bad)
    with pytest.raises(ValueError, match="SGLang runs as a server"):
        EngineSpec.parse("sglang:/models/tiny")
    pool = EngineSpec.parse("hf:http://127.0.0.1:30000,http://127.0.0.1:30001")
    assert pool.urls == ["http://127.0.0.1:30000", "http://127.0.0.1:30001"]
    assert EngineSpec.parse("hf:/models/tiny").urls == []
    with pytest.raises(ValueError, match="each comma-separated server is an http:// or https:// URL"):
        EngineSpec.parse("sglang:http://127.0.0.1:30000,/models/tiny")
    assert load_runner_factory("tests.runners:make_noop_runner").__name__ == "make_noop_runner"
    for bad, message in (
        ("nocolon", "module:function"),
        ("no.such.module:f", "cannot import"),
        ("tests.runners:nope", "no callable"),
    ):
        with pytest.raises(ValueError, match=message):
            load_runner_factory(bad)
