"""The stack's one decision about trajectories, how far behind the trainer's policy each one is; and how a
batch's episodes start generating at the embedded engine."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from tests.hf_models import Loaded
from tests.runners import SETTINGS, trajectory_for
from tests.test_engine_hf import greedy, user_turn
from vistarl.trainer.queue.memory import MemoryQueue
from vistarl.trainer.rollout.engines.base import GenerateRequest, GenerateResult
from vistarl.trainer.rollout.engines.hf import HFEngine
from vistarl.trainer.rollout.engines.scripted import ScriptedEngine
from vistarl.trainer.rollout.job import EpisodeJob
from vistarl.trainer.rollout.processor import VLProcessor
from vistarl.trainer.run.stack import Stack, StalePolicyError, StartTogether


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


def staggered(engine: HFEngine, count: int, gap_s: float) -> list[asyncio.Task[GenerateResult]]:
    """`count` first turns sent `gap_s` apart, as a batch's episodes send theirs when their resets end."""

    async def one(index: int) -> GenerateResult:
        await asyncio.sleep(index * gap_s)
        ids = user_turn(engine.processor, f"episode {index}")
        return await engine.generate(GenerateRequest(engine_ids=ids, sampling=greedy(2)))

    return [asyncio.create_task(one(index)) for index in range(count)]


async def test_a_batchs_first_requests_start_together_within_a_bound_and_at_a_holds_end(
    qwen25: Loaded,
) -> None:
    """Held at its start, a batch's first requests, arriving 50 ms apart, run in one prompt pass (let go
    as they come, in several); with fewer arrivals than the workers run at once the hold ends at its bound;
    inside `holding` (overlapped resets) the start lets nothing go, and the hold's end waits for them."""
    passes = {}
    for together in (None, StartTogether(in_flight=4, wait_s=10.0)):
        engine = HFEngine(*qwen25, batch_wait_s=0.0)
        stack = Stack(MemoryQueue("stack-start"), engine, "counter", start_together=together)
        async with stack._starting_together(6):  # six jobs, four at once
            tasks = staggered(engine, 4, 0.05)
        assert all(not result.aborted for result in await asyncio.gather(*tasks))
        passes[together is not None] = engine.stats.prompt_passes
        await engine.close()
    assert passes[True] == 1 < passes[False]

    engine = HFEngine(*qwen25, batch_wait_s=0.0)
    stack = Stack(MemoryQueue("stack-bound"), engine, "counter", start_together=StartTogether(5, 0.3))
    started = time.monotonic()
    async with stack._starting_together(5):
        tasks = staggered(engine, 4, 0.0)
    assert 0.3 <= time.monotonic() - started < 5.0
    await asyncio.gather(*tasks)

    passes_before = engine.stats.prompt_passes
    async with stack.holding(True):
        async with stack._starting_together(2):
            tasks = staggered(engine, 2, 0.2)
        await asyncio.sleep(0.05)
        assert engine.queued == 1  # the first waits for the hold's end, which waits for the second
    assert all(not result.aborted for result in await asyncio.gather(*tasks))
    assert engine.stats.prompt_passes == passes_before + 1
    await engine.close()
