"""The episode queue's semantics, run against both backends: Redis (a real redis-server) and in-process."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis

from tests.runners import SETTINGS, trajectory_for
from vistarl.trainer.config import RolloutConfig
from vistarl.trainer.queue import open_queue
from vistarl.trainer.queue.base import EpisodeQueue, QueueFull, pack, unpack
from vistarl.trainer.queue.consumer import ResultConsumer
from vistarl.trainer.queue.memory import MemoryQueue
from vistarl.trainer.queue.redis import RedisQueue
from vistarl.trainer.rollout.job import EpisodeJob, EpisodeSettings

QueueMaker = Callable[..., EpisodeQueue]


def job(episode_id: str, **fields: Any) -> EpisodeJob:
    return EpisodeJob(
        **{"episode_id": episode_id, "group_id": "g0", "env": "counter", "settings": SETTINGS, **fields}
    )


@pytest.fixture(params=["memory", "redis"])
async def make_queue(request: pytest.FixtureRequest, redis_url: str) -> AsyncIterator[QueueMaker]:
    """Open queues on one fresh namespace; a second call is a second client of the same queue."""
    namespace = f"test-{uuid.uuid4().hex[:10]}"
    opened: list[EpisodeQueue] = []

    def make(**policy: Any) -> EpisodeQueue:
        if request.param == "memory" and opened:
            return opened[0]
        queue = open_queue(None if request.param == "memory" else redis_url, namespace, **policy)
        opened.append(queue)
        return queue

    yield make
    for queue in opened:
        await queue.close()


async def finish(queue: EpisodeQueue, consumer: str, count: int = 10, **fields: Any) -> list[str]:
    """Take jobs as `consumer` and publish a trajectory for each; returns their episode ids."""
    deliveries = await queue.take(consumer, count, 0.5)
    await queue.complete([(d, trajectory_for(d.job, **fields).to_msgpack()) for d in deliveries])
    return [d.job.episode_id for d in deliveries]


async def test_job_goes_through_and_stats_follow(make_queue: QueueMaker) -> None:
    queue = make_queue()
    assert await queue.enqueue([job("a"), job("b", seed=7, options={"target": 2})]) == 2
    stats = await queue.stats()
    assert (stats.pending, stats.in_flight, stats.results, stats.dead) == (2, 0, 0, 0)
    assert stats.lag_s >= 0.0

    [first] = await queue.take("w1", 1, 0.5)
    assert first.job == job("a")
    stats = await queue.stats()
    assert (stats.pending, stats.in_flight) == (1, 1)

    await queue.complete([(first, trajectory_for(first.job, episode_reward=1.0).to_msgpack())])
    stats = await queue.stats()
    assert (stats.pending, stats.in_flight, stats.results) == (1, 0, 1)

    consumer = ResultConsumer(queue)
    [result] = await consumer.collect(5, timeout_s=0.5)
    assert result == trajectory_for(first.job, episode_reward=1.0)
    assert (await queue.stats()).results == 0


async def test_failed_attempts_retry_then_dead_letter_with_last_error(make_queue: QueueMaker) -> None:
    queue = make_queue(max_attempts=2)
    await queue.enqueue([job("poison")])
    [first] = await queue.take("w1", 1, 0.5)
    assert await queue.fail(first, "boom 1") is False

    [second] = await queue.take("w2", 1, 0.5)
    assert second.job.attempt == 2
    assert second.job.errors == ["attempt 1: boom 1"]
    assert await queue.fail(second, "boom 2") is True

    assert await queue.take("w1", 1, 0.1) == []
    [letter] = await queue.dead_letters()
    assert (letter.episode_id, letter.attempts, letter.error) == ("poison", 2, "boom 2")
    assert letter.job["errors"] == ["attempt 1: boom 1", "attempt 2: boom 2"]
    assert (await queue.stats()).dead == 1

    assert await queue.requeue_dead([letter.id]) == [letter.id]
    [again] = await queue.take("w1", 1, 0.5)
    assert (again.job.attempt, again.job.errors) == (1, [])
    assert (await queue.stats()).dead == 0


async def test_failing_an_entry_twice_moves_it_once(make_queue: QueueMaker) -> None:
    queue = make_queue()
    await queue.enqueue([job("a")])
    [delivery] = await queue.take("w1", 1, 0.5)
    await queue.fail(delivery, "first report")
    await queue.fail(delivery, "late second report")
    [retry] = await queue.take("w1", 5, 0.5)
    assert retry.job.errors == ["attempt 1: first report"]
    assert await queue.take("w1", 5, 0.1) == []


async def test_jobs_of_a_silent_worker_are_reclaimed_as_worker_lost(make_queue: QueueMaker) -> None:
    queue = make_queue(lease_s=0.5, max_attempts=2)
    await queue.enqueue([job("a")])
    await queue.take("dead-worker", 1, 0.5)
    assert await queue.reclaim("live-worker") == {}

    await asyncio.sleep(0.6)
    assert await queue.reclaim("live-worker") == {"dead-worker": 1}
    [retry] = await queue.take("live-worker", 1, 0.5)
    assert retry.job.attempt == 2
    assert retry.job.errors[0].startswith("attempt 1: worker lost: dead-worker sent no heartbeat")

    await asyncio.sleep(0.6)
    assert await queue.reclaim("another-worker") == {"live-worker": 1}
    [letter] = await queue.dead_letters()
    assert letter.attempts == 2
    assert letter.error.startswith("worker lost: live-worker")


async def test_workers_are_those_heartbeating_within_their_lease(make_queue: QueueMaker) -> None:
    """Worker "idle" beats again 1.2 s after "killed": at 1.6 s, killed's lease has run out, idle's has 1.1 s
    left, so a stall of up to a second on a loaded machine cannot fail the count."""
    queue = make_queue(lease_s=1.5)
    assert (await queue.stats()).workers == 0
    for consumer in ("idle", "killed", "leaving"):
        await queue.heartbeat(consumer, [])
    assert (await queue.stats()).workers == 3
    await queue.forget_consumer("leaving")
    assert (await queue.stats()).workers == 2

    await asyncio.sleep(1.2)
    await queue.heartbeat("idle", [])
    await asyncio.sleep(0.4)
    assert (await queue.stats()).workers == 1


async def test_heartbeats_keep_a_lease_and_report_a_lost_one(make_queue: QueueMaker) -> None:
    queue = make_queue(lease_s=1.0)
    await queue.enqueue([job("long")])
    [delivery] = await queue.take("w1", 1, 0.5)
    for _ in range(8):
        await asyncio.sleep(0.2)
        assert await queue.heartbeat("w1", [delivery.entry_id]) == {delivery.entry_id}
        assert await queue.reclaim("w2") == {}

    await asyncio.sleep(1.1)
    assert await queue.reclaim("w2") == {"w1": 1}
    assert await queue.heartbeat("w1", [delivery.entry_id]) == set()


async def test_release_hands_a_job_back_without_counting_an_attempt(make_queue: QueueMaker) -> None:
    queue = make_queue()
    await queue.enqueue([job("a")])
    deliveries = await queue.take("w1", 1, 0.5)
    await queue.release(deliveries)
    [again] = await queue.take("w2", 1, 0.5)
    assert (again.job.attempt, again.job.errors) == (1, [])


async def test_each_episode_is_delivered_once_even_across_consumer_restarts(make_queue: QueueMaker) -> None:
    queue = make_queue()
    await queue.enqueue([job("twice"), job("twice"), job("other")])
    await finish(queue, "w1")
    consumer = ResultConsumer(queue)
    results = await consumer.collect(3, timeout_s=0.5)
    assert sorted(r.episode_id for r in results) == ["other", "twice"]
    assert consumer.duplicates_dropped == 1

    await queue.enqueue([job("twice")])
    await finish(queue, "w1")
    restarted = ResultConsumer(make_queue())
    assert await restarted.collect(1, timeout_s=0.5) == []
    assert restarted.duplicates_dropped == 1


async def test_results_read_but_not_acknowledged_reach_the_next_consumer(make_queue: QueueMaker) -> None:
    queue = make_queue()
    await queue.enqueue([job("a"), job("b")])
    await finish(queue, "w1")
    read_then_crashed = await queue.read_results("trainer", 10, 0.5, own_pending=False)
    assert len(read_then_crashed) == 2

    results = await ResultConsumer(make_queue()).collect(2, timeout_s=1.0)
    assert sorted(r.episode_id for r in results) == ["a", "b"]


async def test_results_that_are_not_trajectories_are_rejected_and_counted(make_queue: QueueMaker) -> None:
    queue = make_queue()
    await queue.enqueue([job(name) for name in ("fine", "garbage", "partial", "bad-status", "misaligned")])
    deliveries = {d.job.episode_id: d for d in await queue.take("w1", 10, 0.5)}
    fine = trajectory_for(deliveries["fine"].job).to_dict()
    payloads = {
        "fine": pack(fine),
        "garbage": b"\xc1 not msgpack",
        "partial": pack({"episode_id": "partial"}),
        "bad-status": pack({**fine, "episode_id": "bad-status", "status": "DONE"}),
        "misaligned": pack({**fine, "episode_id": "misaligned", "train_ids": [1, 2], "loss_mask": [0]}),
    }
    await queue.complete([(deliveries[name], payload) for name, payload in payloads.items()])
    consumer = ResultConsumer(queue)
    results = await consumer.collect(5, timeout_s=0.5)
    assert [r.episode_id for r in results] == ["fine"]
    assert sum(consumer.rejected.values()) == 4
    assert consumer.rejected["not msgpack"] == 1
    assert consumer.rejected["status: enum"] == 1
    assert any(reason.startswith("group_id") for reason in consumer.rejected)
    assert (await queue.stats()).results == 0


async def test_a_jobs_settings_and_its_trajectorys_behaviour_cross_the_queue_whole(redis_url: str) -> None:
    """The settings a job is played with, and the behaviour its trajectory reports to the learner, go
    through the Redis streams as msgpack of JSON data and come back equal."""
    rollout = RolloutConfig(rollout_temperature=0.7, rollout_top_p=0.9, top_k=20, max_staleness=2)
    settings = EpisodeSettings.of(rollout).sampled_with(min_p=0.05, stop=["</answer>"])
    async with RedisQueue(redis_url, f"settings-{uuid.uuid4().hex[:10]}") as queue:
        await queue.enqueue([job("e1", settings=settings)])
        raw = aioredis.Redis.from_url(redis_url)
        [(_, fields)] = await raw.xrange(queue.keys.jobs)
        await raw.aclose()
        assert json.loads(json.dumps(unpack(fields[b"j"])))["settings"] == settings.model_dump()
        [delivery] = await queue.take("w1", 1, 0.5)
        assert delivery.job.settings == settings
        await queue.complete([(delivery, trajectory_for(delivery.job).to_msgpack())])
        [result] = await ResultConsumer(queue).collect(1, timeout_s=0.5)
    assert result.behaviour == settings.behaviour
    assert (result.behaviour.temperature, result.behaviour.top_p, result.behaviour.max_staleness) == (
        0.7,
        0.9,
        2,
    )


async def test_enqueue_waits_for_room_under_max_in_flight(make_queue: QueueMaker) -> None:
    queue = make_queue()
    with pytest.raises(QueueFull) as full:
        await queue.enqueue([job(f"e{i}") for i in range(5)], max_in_flight=3, timeout_s=0.3)
    assert full.value.enqueued == 3
    assert (await queue.stats()).pending == 3

    rest = asyncio.create_task(queue.enqueue([job("e3"), job("e4")], max_in_flight=3, timeout_s=10.0))
    await asyncio.sleep(0.2)
    assert not rest.done()
    await finish(queue, "w1", count=2)
    assert await rest == 2
    assert (await queue.stats()).pending == 3


async def test_a_malformed_job_is_dead_lettered_not_dropped(make_queue: QueueMaker) -> None:
    queue = make_queue()
    await queue._add([b"\xc1 not msgpack", b"\x81\xa1x\x01"])
    await queue.enqueue([job("fine")])
    delivered = [d.job.episode_id for d in await queue.take("w1", 10, 0.5)]
    assert delivered == ["fine"]
    letters = await queue.dead_letters()
    assert [letter.error.split(":")[0] for letter in letters] == ["malformed job", "malformed job"]
    assert letters[1].job == {"x": 1}


def test_bad_input_is_rejected_with_clear_errors() -> None:
    with pytest.raises(ValueError, match="extra"):
        EpisodeJob.model_validate({"episode_id": "a", "group_id": "g", "env": "e", "sede": 1})
    with pytest.raises(ValueError, match="namespace"):
        MemoryQueue("has space")
    with pytest.raises(ValueError, match="max_attempts"):
        MemoryQueue("ok", max_attempts=0)


async def test_namespaces_share_one_redis_without_mixing(redis_url: str) -> None:
    suffix = uuid.uuid4().hex[:10]
    async with RedisQueue(redis_url, f"one-{suffix}") as one, RedisQueue(redis_url, f"two-{suffix}") as two:
        await one.enqueue([job("a"), job("b")])
        assert (await one.stats()).pending == 2
        assert (await two.stats()).pending == 0
        assert await two.take("w", 10, 0.1) == []


async def test_a_lost_consumer_group_is_recreated_without_losing_jobs(redis_url: str) -> None:
    namespace = f"test-{uuid.uuid4().hex[:10]}"
    async with RedisQueue(redis_url, namespace) as queue:
        await queue.enqueue([job("a"), job("b")])
        raw = aioredis.Redis.from_url(redis_url)
        await raw.xgroup_destroy(queue.keys.jobs, "workers")
        await raw.aclose()
        assert sorted(d.job.episode_id for d in await queue.take("w1", 10, 0.5)) == ["a", "b"]
