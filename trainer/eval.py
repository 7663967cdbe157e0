"""Greedy evaluation on held-out tasks: success rate, mean reward, mean turns, and the env's benchmark scores.

`evaluate` plays one episode per held-out task through the run's stack with temperature 0: the first rows
of `env.eval_split` (a split the env holds, such as Geo3k's or VSI's `test`) when it is set, else one level
per seed of `env.eval_seeds` (seeds training never plays). It saves each trajectory with its images, and
adds the env's own benchmark scores (`EnvFactory.benchmark`, e.g. VSI-Bench's per task and overall).

`baseline_policy` turns an env's `random_reply` into the responder of a `ScriptedEngine`: the random
player of `vistarl eval --dummy`.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vistarl.services.env_api import EnvFactory, EpisodeScore, load_env_factory
from vistarl.trainer.config import TrainConfig
from vistarl.trainer.rollout.engines.base import GenerateRequest
from vistarl.trainer.rollout.engines.scripted import Responder
from vistarl.trainer.rollout.env_handle import split_size
from vistarl.trainer.rollout.job import EpisodeSettings, group_jobs
from vistarl.trainer.rollout.processor import VLProcessor
from vistarl.trainer.rollout.trajectory import Trajectory
from vistarl.trainer.run.outputs import save_trajectory
from vistarl.trainer.run.stack import Stack

__all__ = ["baseline_policy", "eval_starts", "evaluate", "summarize"]

ENV_PREFIX = "env/"


async def eval_starts(cfg: TrainConfig, env: str, limit: int | None = None) -> list[dict[str, Any]]:
    """The held-out episode starts: rows of `env.eval_split` (their count asked of the env), else the eval
    seeds; the first `limit` of them."""
    split = cfg.env.eval_split
    if split is None:
        return [{"seed": seed, "options": dict(cfg.env.options)} for seed in cfg.env.eval_seed_range][:limit]
    size = await split_size(env, split, "env.eval_split")
    count = min(size, limit or size)
    return [{"task_id": f"{split}/{index}", "options": dict(cfg.env.options)} for index in range(count)]


async def evaluate(
    stack: Stack,
    cfg: TrainConfig,
    *,
    version: int,
    key: str,
    out_dir: Path | None = None,
    max_episodes: int | None = None,
) -> dict[str, float]:
    """Play the held-out tasks greedily (the first `max_episodes`) and summarize them as `eval/*` metrics.

    Episodes that do not finish within `rollout.collect_timeout_s` count as missing.
    """
    starts = await eval_starts(cfg, stack.env, max_episodes)
    greedy = EpisodeSettings.of(cfg.rollout).sampled_with(temperature=0.0)
    jobs = group_jobs(stack.env, starts, 1, settings=greedy, policy_version=version, prefix=key)
    await stack.submit(key, jobs)
    gathered = await stack.gather(key, cfg.rollout.collect_timeout_s)
    order = {job.episode_id: index for index, job in enumerate(jobs)}
    trajectories = sorted(gathered.trajectories, key=lambda t: order[t.episode_id])
    if out_dir is not None:
        for trajectory in trajectories:
            save_trajectory(trajectory, out_dir / f"episode-{order[trajectory.episode_id]:03d}")
    benchmark = {} if cfg.env.is_openenv else benchmark_scores(trajectories, load_env_factory(cfg.env.name))
    return {**summarize(trajectories), **benchmark, "eval/missing": float(gathered.missing)}


def summarize(trajectories: list[Trajectory]) -> dict[str, float]:
    """Success rate (the env's `success` metric), mean reward and mean turns; failed episodes count as 0."""
    count = len(trajectories)
    if not count:
        return {"eval/episodes": 0.0}
    scored = [t for t in trajectories if t.status.played]
    return {
        "eval/episodes": float(count),
        "eval/success_rate": sum(t.metrics.get("env/success", 0.0) for t in scored) / count,
        "eval/reward_mean": sum(t.episode_reward for t in scored) / count,
        "eval/turns_mean": sum(t.metrics.get("turns", 0.0) for t in trajectories) / count,
        "eval/failed": float(count - len(scored)),
    }


def benchmark_scores(trajectories: list[Trajectory], factory: EnvFactory) -> dict[str, float]:
    """The env's benchmark over the played episodes, as `eval/benchmark/<name>` (none without a benchmark)."""
    if factory.benchmark is None:
        return {}
    episodes = [
        EpisodeScore(
            labels=t.labels,
            metrics={k.removeprefix(ENV_PREFIX): v for k, v in t.metrics.items() if k.startswith(ENV_PREFIX)},
            reward=t.episode_reward,
        )
        for t in trajectories
        if t.status.played
    ]
    return {f"eval/benchmark/{name}": value for name, value in factory.benchmark(episodes).items()}


def baseline_policy(random_reply: Callable[[str, random.Random], str], processor: VLProcessor) -> Responder:
    """A `ScriptedEngine` responder that plays `random_reply` on the conversation so far.

    Each reply is drawn from the request's sampling seed and prompt length, so an episode's replies do
    not depend on how requests interleave.
    """

    def respond(index: int, request: GenerateRequest) -> str:
        rng = random.Random(f"{request.sampling.sampling_seed}-{len(request.engine_ids)}")
        return random_reply(processor.tokenizer.decode(request.engine_ids), rng)

    return respond
