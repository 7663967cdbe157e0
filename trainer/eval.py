"""Greedy evaluation on held-out levels: success rate, mean reward and mean turns over the eval seeds.

`evaluate` plays one episode per seed of `env.eval_seeds` (never used for training) through the
run's stack with temperature 0, and saves each trajectory with its images. `random_moves` is the
responder of a random-move agent (a `ScriptedEngine` that answers `<answer>…</answer>` with random
moves), the baseline `vistarl eval --dummy` plays.
"""

from __future__ import annotations

import random
from pathlib import Path

from trainer.config import TrainConfig
from trainer.rollout.engines.base import GenerateRequest
from trainer.rollout.engines.scripted import Responder
from trainer.rollout.job import group_jobs
from trainer.rollout.trajectory import Trajectory
from trainer.run_logging import save_trajectory
from trainer.stack import Stack, episode_sampling

__all__ = ["SOKOBAN_MOVES", "evaluate", "random_moves", "summarize"]

SOKOBAN_MOVES = ("Up", "Down", "Left", "Right")


async def evaluate(
    stack: Stack,
    cfg: TrainConfig,
    *,
    version: int,
    key: str,
    out_dir: Path | None = None,
    max_episodes: int | None = None,
) -> dict[str, float]:
    """Play the eval seeds greedily (the first `max_episodes` of them) and summarize as `eval/*` metrics.

    Episodes that do not finish within `rollout.collect_timeout_s` count as missing.
    """
    seeds = list(cfg.env.eval_seed_range)[:max_episodes]
    starts = [{"seed": seed, "options": dict(cfg.env.options)} for seed in seeds]
    sampling = {**episode_sampling(cfg.rollout), "temperature": 0.0}
    jobs = group_jobs(stack.env, starts, 1, sampling=sampling, policy_version=version, prefix=key)
    await stack.submit(key, jobs)
    gathered = await stack.gather(key, cfg.rollout.collect_timeout_s)
    trajectories = sorted(gathered.trajectories, key=lambda t: t.episode_id)
    if out_dir is not None:
        for index, trajectory in enumerate(trajectories):
            save_trajectory(trajectory, out_dir / f"episode-{index:03d}")
    return {**summarize(trajectories), "eval/missing": float(gathered.missing)}


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


def random_moves(moves: tuple[str, ...] = SOKOBAN_MOVES, max_moves: int = 3) -> Responder:
    """A responder answering `<answer>m1, m2</answer>` with 1..`max_moves` random moves.

    Each reply is drawn from the request's sampling seed and prompt length, so an episode's moves do
    not depend on how requests interleave.
    """

    def respond(index: int, request: GenerateRequest) -> str:
        rng = random.Random(f"{request.sampling.sampling_seed}-{len(request.engine_ids)}")
        chosen = [rng.choice(moves) for _ in range(rng.randint(1, max_moves))]
        return f"<answer>{', '.join(chosen)}</answer>"

    return respond
