"""Episode runners: `RolloutRunner` plays one job at a time on a shared engine; `run_jobs` runs many at once.

A runner is what a worker calls for each job it takes: `async (EpisodeJob) -> Trajectory`. It never
raises for an episode that went wrong; that is a trajectory with its status and error.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence

from vistarl.trainer.config import RolloutConfig
from vistarl.trainer.rollout.engines.base import Engine
from vistarl.trainer.rollout.env_handle import Envs
from vistarl.trainer.rollout.episode import failed_trajectory, run_episode
from vistarl.trainer.rollout.episode_env import EnvError
from vistarl.trainer.rollout.job import EpisodeJob
from vistarl.trainer.rollout.processor import VLProcessor
from vistarl.trainer.rollout.rewards import RewardFn, env_reward
from vistarl.trainer.rollout.tokenization import TurnEncoder
from vistarl.trainer.rollout.trajectory import Trajectory

__all__ = ["RolloutRunner", "run_jobs"]


class RolloutRunner:
    """Maps `job.env` through `env_urls` (else takes it as given) to an env, then runs the episode on it."""

    def __init__(
        self,
        engine: Engine,
        processor: VLProcessor,
        config: RolloutConfig | None = None,
        *,
        env_urls: Mapping[str, str] | None = None,
        reward_fn: RewardFn = env_reward,
        deadline_s: float | None = None,
        envs: Envs | None = None,
    ) -> None:
        self.engine = engine
        self.encoder = TurnEncoder(processor)
        self.config = config or RolloutConfig()
        self.env_urls = dict(env_urls or {})
        self.reward_fn = reward_fn
        self.deadline_s = deadline_s
        self.envs = envs or Envs(outage_s=self.config.env_outage_s)

    async def __call__(self, job: EpisodeJob) -> Trajectory:
        """Run one job; the trajectory has any status, FAILED when the env cannot even be opened."""
        started = time.perf_counter()
        try:
            env = await self.envs.open(self.env_urls.get(job.env, job.env))
        except EnvError as exc:
            return failed_trajectory(job, str(exc), started)
        return await run_episode(
            env,
            self.engine,
            self.encoder,
            job,
            reward_fn=self.reward_fn,
            deadline_s=self.deadline_s,
        )

    async def aclose(self) -> None:
        """Close the env clients and services, and the engine."""
        await self.envs.aclose()
        await self.engine.close()


async def run_jobs(
    runner: Callable[[EpisodeJob], Awaitable[Trajectory]], jobs: Sequence[EpisodeJob], concurrency: int
) -> AsyncIterator[Trajectory]:
    """Run `jobs` with at most `concurrency` in flight; yield each trajectory as it finishes."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    slots = asyncio.Semaphore(concurrency)

    async def run(job: EpisodeJob) -> Trajectory:
        async with slots:
            return await runner(job)

    tasks = [asyncio.create_task(run(job)) for job in jobs]
    try:
        for finished in asyncio.as_completed(tasks):
            yield await finished
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
