"""What each training step plays: `PromptSource` (episode starts at a resumable position) and `step_jobs`
(a step's starts as episode jobs, each `n_samples_per_prompt` times)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from vistarl.services.datasets import ParquetSplit
from vistarl.services.env_api import TaskSplit
from vistarl.trainer.config import TrainConfig
from vistarl.trainer.rollout.env_handle import split_size
from vistarl.trainer.rollout.job import EpisodeJob, EpisodeSettings, group_jobs
from vistarl.trainer.seeds import derived_seed

__all__ = ["PromptSource", "step_jobs"]


class PromptSource:
    """Episode starts for training, addressed by a resumable position: one of

    - procedural env seeds, counting up from 0 and jumping over the eval range, so training never plays
      an eval level (the default);
    - the rows of a parquet of samples (`env.dataset`), sent whole as each episode's `sample`;
    - the tasks of a split the env holds (`env.task_split`), sent as `task_id`s.

    Rows and tasks are visited in a shuffled order that changes every epoch. `env.options` go with every
    start; a dataset row whose `extra_info.seed` lies in the eval range is an error.
    """

    def __init__(self, cfg: TrainConfig, rows: TaskSplit | None = None, tasks: int = 0) -> None:
        self.options = dict(cfg.env.options)
        self.eval_seeds = cfg.env.eval_seed_range
        self.shuffle_seed = cfg.train.seed
        self.rows = rows
        self.split = cfg.env.task_split
        self.count = len(rows) if rows is not None else tasks

    @classmethod
    async def create(cls, cfg: TrainConfig, env: str) -> PromptSource:
        """The source `cfg.env` asks for; a task split's size is asked of the env itself."""
        if cfg.env.dataset is not None:
            return cls(cfg, rows=_dataset_rows(cfg.env.dataset, cfg.env.eval_seed_range))
        if cfg.env.task_split is not None:
            return cls(cfg, tasks=await split_size(env, cfg.env.task_split, "env.task_split"))
        return cls(cfg)

    def take(self, cursor: int, count: int) -> list[dict[str, Any]]:
        """The starts at positions `cursor .. cursor + count - 1`."""
        return [self._start(position) for position in range(cursor, cursor + count)]

    def _start(self, position: int) -> dict[str, Any]:
        """The start at `position`: a seed past the eval range, or a row or task of this epoch's order."""
        if not self.count:
            seed = position if position < self.eval_seeds.start else position + len(self.eval_seeds)
            if seed in self.eval_seeds:
                raise AssertionError(f"training seed {seed} lies in the eval range {self.eval_seeds}")
            return {"seed": seed, "options": self.options}
        epoch, index = divmod(position, self.count)
        order = list(range(self.count))
        random.Random(derived_seed(self.shuffle_seed, epoch)).shuffle(order)
        if self.rows is not None:
            return {"sample": self.rows[order[index]], "options": self.options}
        return {"task_id": f"{self.split}/{order[index]}", "options": self.options}


def _dataset_rows(path: Path, eval_seeds: range) -> ParquetSplit:
    """The rows of a parquet of samples; refuses an empty file and rows whose seed is an eval seed."""
    import pyarrow.parquet as pq  # only a run that trains on a parquet split needs it

    rows = ParquetSplit(path)
    if not len(rows):
        raise ValueError(f"dataset {path} has no rows")
    if "extra_info" in pq.read_schema(path).names:
        for index, row in enumerate(pq.read_table(path, columns=["extra_info"]).to_pylist()):
            seed = (row["extra_info"] or {}).get("seed")
            if seed in eval_seeds:
                raise ValueError(f"dataset {path} row {index} uses seed {seed}, an eval seed")
    return rows


def step_jobs(
    cfg: TrainConfig, env: str, prompts: PromptSource, step: int, version: int, tag: str
) -> list[EpisodeJob]:
    """The episode jobs of step `step` (1-based): its starts, each `n_samples_per_prompt` times."""
    rollout = cfg.rollout
    cursor = (step - 1) * rollout.rollout_batch_size
    return group_jobs(
        env,
        prompts.take(cursor, rollout.rollout_batch_size),
        rollout.n_samples_per_prompt,
        settings=EpisodeSettings.of(rollout),
        policy_version=version,
        seed=derived_seed(cfg.train.seed, step),
        prefix=f"{tag}-s{step:06d}",
    )
