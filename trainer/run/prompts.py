"""What each training step plays: `PromptSource` (episode starts at a resumable position) and `step_jobs`
(a step's starts as episode jobs, each `n_samples_per_prompt` times)."""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from vistarl.services.datasets import ParquetSplit
from vistarl.services.env_api import TaskSplit, load_env_factory
from vistarl.trainer.config import EnvConfig, TrainConfig
from vistarl.trainer.rollout.env_handle import split_size
from vistarl.trainer.rollout.job import EpisodeJob, EpisodeSettings, group_jobs
from vistarl.trainer.seeds import derived_seed

__all__ = ["MAX_SKIPPED_SEEDS", "PromptSource", "step_jobs"]

MAX_SKIPPED_SEEDS = 10_000
"""Seeds in a row whose task is a held-out one before the source gives up rather than search on."""

TaskKey = Callable[[int], str | None]


class PromptSource:
    """Episode starts for training, addressed by a resumable position: one of

    - procedural env seeds, counting up from 0 and jumping over the held-out ranges (`env.eval_seeds`,
      `env.confirm_seeds`), and over every seed whose task is a held-out seed's where the env says what
      a seed's task is (`EnvFactory.task_key`: a Sokoban seed's level), so training never plays a
      held-out level, by seed or by content (the default);
    - the rows of a parquet of samples (`env.dataset`), sent whole as each episode's `sample`;
    - the tasks of a split the env holds (`env.task_split`), sent as `task_id`s.

    Rows and tasks are visited in a shuffled order that changes every epoch. `env.options` go with every
    start; a dataset row whose `extra_info.seed` lies in a held-out range is an error.
    """

    def __init__(self, cfg: TrainConfig, rows: TaskSplit | None = None, tasks: int = 0) -> None:
        self.options = dict(cfg.env.options)
        self.held_out = cfg.env.held_out_seed_ranges
        self.shuffle_seed = cfg.train.seed
        self.rows = rows
        self.split = cfg.env.task_split
        self.count = len(rows) if rows is not None else tasks
        self.task_key = None if self.count else _task_key(cfg.env)
        self.held_out_tasks = _keys(self.task_key, self.held_out)
        """The tasks of the held-out seeds (empty when the env gives no `task_key`)."""
        self._seeds: list[int] = []

    @classmethod
    async def create(cls, cfg: TrainConfig, env: str) -> PromptSource:
        """The source `cfg.env` asks for; a task split's size is asked of the env itself."""
        if cfg.env.dataset is not None:
            return cls(cfg, rows=_dataset_rows(cfg.env.dataset, cfg.env.held_out_seed_ranges))
        if cfg.env.task_split is not None:
            return cls(cfg, tasks=await split_size(env, cfg.env.task_split, "env.task_split"))
        return cls(cfg)

    def take(self, cursor: int, count: int) -> list[dict[str, Any]]:
        """The starts at positions `cursor .. cursor + count - 1`."""
        return [self._start(position) for position in range(cursor, cursor + count)]

    def _start(self, position: int) -> dict[str, Any]:
        """The start at `position`: a training seed, or a row or task of this epoch's order."""
        if not self.count:
            return {"seed": self._seed(position), "options": self.options}
        epoch, index = divmod(position, self.count)
        order = list(range(self.count))
        random.Random(derived_seed(self.shuffle_seed, epoch)).shuffle(order)
        if self.rows is not None:
            return {"sample": self.rows[order[index]], "options": self.options}
        return {"task_id": f"{self.split}/{order[index]}", "options": self.options}

    def _seed(self, position: int) -> int:
        """The training seed at `position`, the seeds before it found first (once per source)."""
        while len(self._seeds) <= position:
            self._seeds.append(self._next_seed(self._seeds[-1] + 1 if self._seeds else 0))
        return self._seeds[position]

    def _next_seed(self, seed: int) -> int:
        """The first seed from `seed` up outside the held-out ranges whose task is not a held-out one."""
        for _ in range(MAX_SKIPPED_SEEDS):
            seed = _past(seed, self.held_out)
            if self.task_key is None or self.task_key(seed) not in self.held_out_tasks:
                return seed
            seed += 1
        raise ValueError(
            f"the {MAX_SKIPPED_SEEDS} seeds before {seed} all give a held-out task: the env options leave "
            "too few tasks outside env.eval_seeds and env.confirm_seeds to train on"
        )


def _past(seed: int, ranges: Sequence[range]) -> int:
    """`seed`, or the first seed after the held-out range(s) it lies in."""
    while inside := [r for r in ranges if seed in r]:
        seed = max(r.stop for r in inside)
    return seed


def _task_key(env: EnvConfig) -> TaskKey | None:
    """The env's `task_key` under `env.options`, or None: an OpenEnv server, an env without one, or an env
    that cannot be loaded on this machine but runs at `env.url` (as `load_config` lets it)."""
    if env.is_openenv:
        return None
    try:
        factory = load_env_factory(env.name)
    except ValueError:
        if env.url is not None:
            return None
        raise
    if factory.task_key is None:
        return None
    return functools.partial(factory.task_key, factory.options_model.model_validate(env.options))


def _keys(task_key: TaskKey | None, ranges: Sequence[range]) -> frozenset[str]:
    """The tasks of every seed of `ranges` under `task_key` (none without one)."""
    if task_key is None:
        return frozenset()
    keys = (task_key(seed) for seeds in ranges for seed in seeds)
    return frozenset(key for key in keys if key is not None)


def _dataset_rows(path: Path, held_out: Sequence[range]) -> ParquetSplit:
    """The rows of a parquet of samples; refuses an empty file and rows whose seed is a held-out seed."""
    import pyarrow.parquet as pq  # only a run that trains on a parquet split needs it

    rows = ParquetSplit(path)
    if not len(rows):
        raise ValueError(f"dataset {path} has no rows")
    if "extra_info" in pq.read_schema(path).names:
        for index, row in enumerate(pq.read_table(path, columns=["extra_info"]).to_pylist()):
            seed = (row["extra_info"] or {}).get("seed")
            if any(seed in seeds for seeds in held_out):
                raise ValueError(f"dataset {path} row {index} uses seed {seed}, a held-out seed")
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
