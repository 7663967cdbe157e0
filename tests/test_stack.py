"""The stack's one decision about trajectories: how far behind the trainer's policy each one is."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.runners import SETTINGS, trajectory_for
from vistarl.trainer.queue.memory import MemoryQueue
from vistarl.trainer.rollout.engines.scripted import ScriptedEngine
from vistarl.trainer.rollout.job import EpisodeJob
from vistarl.trainer.rollout.processor import VLProcessor
from vistarl.trainer.run.stack import Stack, StalePolicyError


def jobs(versions: range) -> list[EpisodeJob]:
    return [
        EpisodeJob(episode_id=f"v{v}", group_id="g", env="counter", policy_version=v, settings=SETTINGS)
        for v in versions
    ]


async def publish(queue: MemoryQueue, count: int) -> None:
    """Play the queued jobs as a worker would: each trajectory carries its job's policy version."""
    deliveries = await queue.take("w", count, 0.5)
    await queue.complete([(d, trajectory_for(d.job).to_msgpack()) for d in deliveries])


@pytest.fixture
def engine(tiny_qwen25: Path) -> ScriptedEngine:
    return ScriptedEngine(VLProcessor.from_pretrained(tiny_qwen25), ["x"])


async def test_trajectories_beyond_max_staleness_are_counted_not_trained_on(engine: ScriptedEngine) -> None:
    queue = MemoryQueue("stack-stale")
    stack = Stack(queue, engine, "counter", max_staleness=2)
    stack.policy_version = 4
    await stack.submit("step", jobs(range(5)))
    await publish(queue, 5)
    gathered = await stack.gather("step", timeout_s=2.0)
    assert sorted(t.policy_version for t in gathered.trajectories) == [2, 3, 4]
    assert (gathered.stale, gathered.missing) == (2, 0)


async def test_a_trajectory_ahead_of_the_trainer_is_an_error(engine: ScriptedEngine) -> None:
    queue = MemoryQueue("stack-ahead")
    stack = Stack(queue, engine, "counter")
    await stack.submit("step", jobs(range(3, 4)))
    await publish(queue, 1)
    with pytest.raises(StalePolicyError, match="policy version 3, ahead of the trainer's 0"):
        await stack.gather("step", timeout_s=2.0)
