"""Episode runners for queue and worker tests, loadable by `vistarl worker --runner tests.runners:NAME`.

- `make_slow_runner` plays the real counter test env (`tests.envs.counter`) over HTTP, so an episode
  is as slow as the job's `step_delay_s` option makes it, and `fail_on: "inc"` makes it raise.
- `make_noop_runner` answers at once, or as the job's options script it (`sleep_s`, `raise`), for
  in-process tests and the queue benchmark.
"""

from __future__ import annotations

import asyncio
from typing import Any

from vistarl.clients.http import AsyncEnvClient
from vistarl.trainer.config import RolloutConfig
from vistarl.trainer.queue.worker import WorkerOptions
from vistarl.trainer.rollout.job import EpisodeJob, EpisodeSettings
from vistarl.trainer.rollout.trajectory import Status, Trajectory

SETTINGS = EpisodeSettings.of(RolloutConfig())
"""The settings of a job that asks for nothing special: a default rollout config's."""


def trajectory_for(job: EpisodeJob, status: Status = Status.COMPLETED, **fields: Any) -> Trajectory:
    """The smallest valid trajectory for `job` (with the behaviour of its settings), plus `fields`."""
    return Trajectory(
        episode_id=job.episode_id,
        group_id=job.group_id,
        policy_version=job.policy_version,
        status=status,
        behaviour=job.settings.behaviour,
        **fields,
    )


async def scripted_episode(job: EpisodeJob) -> Trajectory:
    """Sleep `options.sleep_s`, raise `options.raise` if set, else return a trajectory whose metrics echo
    the job's numeric options."""
    await asyncio.sleep(float(job.options.get("sleep_s", 0.0)))
    if job.options.get("raise"):
        raise RuntimeError(str(job.options["raise"]))
    echoed = {key: float(value) for key, value in job.options.items() if isinstance(value, (int, float))}
    return trajectory_for(job, metrics=echoed)


def make_noop_runner(options: WorkerOptions) -> Any:
    """Factory for `scripted_episode`: a no-op unless the job's options script a delay or an error."""
    return scripted_episode


class CounterRunner:
    """Counts to the counter env's target by sending "inc", over HTTP with `AsyncEnvClient`.

    `job.env` is an env name mapped by `--env-url NAME=URL`, or the server URL itself.
    """

    def __init__(self, env_urls: dict[str, str]) -> None:
        self.env_urls = env_urls
        self._clients: dict[str, AsyncEnvClient] = {}

    async def __call__(self, job: EpisodeJob) -> Trajectory:
        url = self.env_urls.get(job.env, job.env)
        client = self._clients.get(url) or self._clients.setdefault(url, AsyncEnvClient(url, token=""))
        async with client.episode(seed=job.seed, options=job.options) as episode:
            while not episode.done:
                await episode.step("inc")
            return trajectory_for(job, episode_reward=episode.total_reward, metrics={"turns": episode.turns})

    async def aclose(self) -> None:
        for client in self._clients.values():
            await client.shutdown()


def make_slow_runner(options: WorkerOptions) -> CounterRunner:
    """Factory for `CounterRunner`; slow when jobs set the env's `step_delay_s`."""
    return CounterRunner(options.env_urls)
