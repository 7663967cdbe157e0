"""The runner `vistarl worker` uses by default: a `RolloutRunner` on the engine of `--engine`.

`make_episode_runner(options)` is the factory the CLI injects unless `--runner` names another; the
engine loads on the first job, in the worker's event loop.
"""

from __future__ import annotations

import asyncio

from vistarl.trainer.queue.worker import WorkerOptions
from vistarl.trainer.rollout.engines.loading import load_engine
from vistarl.trainer.rollout.job import EpisodeJob
from vistarl.trainer.rollout.rewards import load_reward_fn
from vistarl.trainer.rollout.runner import RolloutRunner
from vistarl.trainer.rollout.trajectory import Trajectory

__all__ = ["WorkerRunner", "make_episode_runner"]


class WorkerRunner:
    """Loads its engine on the first job, then runs each job with a `RolloutRunner`."""

    def __init__(self, options: WorkerOptions) -> None:
        if options.engine is None:
            raise ValueError("the rollout runner needs an engine (--engine hf:DIR, hf:URL or sglang:URL)")
        self.options = options
        self.engine_spec = options.engine
        self.reward_fn = load_reward_fn(options.reward_path)
        self._runner: RolloutRunner | None = None
        self._loading = asyncio.Lock()

    async def __call__(self, job: EpisodeJob) -> Trajectory:
        """Run one job (loading the engine first, once); an engine that cannot load fails the attempt."""
        return await (await self._ready())(job)

    async def _ready(self) -> RolloutRunner:
        async with self._loading:
            if self._runner is None:
                engine, processor = await load_engine(self.engine_spec, self.options.tokenizer)
                self._runner = RolloutRunner(
                    engine, processor, env_urls=self.options.env_urls, reward_fn=self.reward_fn
                )
            return self._runner

    async def aclose(self) -> None:
        """Close the engine and env clients, if they were loaded."""
        if self._runner is not None:
            await self._runner.aclose()


def make_episode_runner(options: WorkerOptions) -> WorkerRunner:
    """The default runner factory of `vistarl worker` (`--engine`, `--env-url NAME=URL`, `--reward`)."""
    return WorkerRunner(options)
