"""A task reaches its env the same way in process, over HTTP and through the queue: one Geo3k task (by id
and inline) gives the same token-exact trajectory on all three paths, played greedily by the tiny model."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from vistarl.devtools.servers import env_server
from vistarl.services.env_api import load_env_factory
from vistarl.trainer.config import RolloutConfig
from vistarl.trainer.queue.consumer import ResultConsumer
from vistarl.trainer.queue.memory import MemoryQueue
from vistarl.trainer.queue.worker import Worker
from vistarl.trainer.rollout.engines.hf import HFEngine
from vistarl.trainer.rollout.job import EpisodeSettings, group_jobs
from vistarl.trainer.rollout.runner import RolloutRunner
from vistarl.trainer.rollout.trajectory import Status, Trajectory

CONFIG = RolloutConfig(max_turns=3, max_new_tokens=12, rollout_max_response_len=36)
GREEDY = EpisodeSettings.of(CONFIG).sampled_with(
    temperature=0.0, max_new_tokens=4, stop_token_ids=list(range(152_000))
)
"""Greedy one-token replies (any token stops), so every reply reaches the env."""


@pytest.fixture(scope="module")
def geo3k_url() -> Iterator[str]:
    with env_server("geo3k") as url:
        yield url


def starts() -> list[dict[str, Any]]:
    """Test task 3 of Geo3k's own split, once by id and once sent whole."""
    row = load_env_factory("geo3k").splits()["test"][3]
    return [{"task_id": "test/3"}, {"sample": row}]


def fingerprint(trajectory: Trajectory) -> tuple[Any, ...]:
    """What must be equal between paths: both token tracks, mask, images, rewards and the env's verdict."""
    assert trajectory.status is Status.COMPLETED, trajectory.error
    return (
        trajectory.engine_ids,
        trajectory.train_ids,
        trajectory.loss_mask,
        trajectory.images,
        trajectory.turn_rewards,
        trajectory.episode_reward,
    )


async def direct(runner: RolloutRunner, env: str) -> list[Trajectory]:
    """Each start played by calling the runner, as an in-process rollout does."""
    return [await runner(job) for job in group_jobs(env, starts(), 1, settings=GREEDY, prefix="direct")]


async def queued(runner: RolloutRunner, env: str) -> list[Trajectory]:
    """Each start enqueued, run by a worker, and collected by the trainer's consumer."""
    queue = MemoryQueue("tasks-everywhere")
    jobs = group_jobs(env, starts(), 1, settings=GREEDY, prefix="queued")
    stop = asyncio.Event()
    worker = asyncio.create_task(Worker(queue, runner, consumer="w").run(stop))
    await queue.enqueue(jobs)
    collected = await ResultConsumer(queue).collect(len(jobs), timeout_s=120)
    stop.set()
    await worker
    order = [job.episode_id for job in jobs]
    return sorted(collected, key=lambda t: order.index(t.episode_id))


async def test_one_task_one_trajectory_in_process_over_http_and_through_the_queue(
    tiny_qwen25: Path, geo3k_url: str
) -> None:
    engine = HFEngine.from_pretrained(tiny_qwen25)
    runner = RolloutRunner(engine, engine.processor, CONFIG)
    try:
        played = {
            "in process": await direct(runner, "geo3k"),
            "over HTTP": await direct(runner, geo3k_url),
            "through the queue": await queued(runner, geo3k_url),
        }
    finally:
        await runner.aclose()
    by_id, inline = played["in process"]
    assert fingerprint(by_id) == fingerprint(inline), "a task id and the same row sent whole differ"
    assert by_id.images, "the diagram reached the trajectory"
    for path, trajectories in played.items():
        assert [fingerprint(t) for t in trajectories] == [fingerprint(by_id)] * 2, path
        assert [t.task_id for t in trajectories] == ["test/3", None], path  # the start each was reset from
