"""What one episode is asked to be: `EpisodeJob`, the record the queue carries from the trainer to a worker,
and its `EpisodeSettings`: how it is played. A job always carries its settings, so a worker plays it as
the trainer asked, whatever its own config; the trajectory carries them on as its `Behaviour`, which the
learner reads (docs/rollout.md, "Jobs").

`group_jobs` expands episode starts into groups of jobs that share a `group_id` (GRPO's groups).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from vistarl.trainer.config import RolloutConfig, check_budgets
from vistarl.trainer.rollout.engines.sglang_api import SamplingParams
from vistarl.trainer.rollout.trajectory import Behaviour

__all__ = ["START_KEYS", "EpisodeJob", "EpisodeSettings", "group_jobs"]

START_KEYS = frozenset({"seed", "task_id", "sample", "options"})
"""The keys of an episode start: how the env is reset."""


class EpisodeSettings(BaseModel):
    """How one episode is played: its turn and token budgets, the engine's sampling params (whose
    `max_new_tokens` is the per-turn budget), and how stale it may be trained on. Built once from the run's
    config (`of`) and carried as is."""

    model_config = ConfigDict(extra="forbid")

    max_turns: int = Field(ge=1)
    rollout_max_response_len: int = Field(ge=1, description="generated tokens per episode")
    rollout_max_context_len: int = Field(ge=1, description="context tokens per episode")
    sampling: SamplingParams
    max_staleness: int = Field(
        default=0,
        ge=0,
        description="policy versions the episode may lag behind the trainer's when trained on",
    )

    @model_validator(mode="after")
    def _budgets(self) -> EpisodeSettings:
        """The per-turn budget fits in the episode budget, which fits in the context."""
        check_budgets(
            self.sampling.max_new_tokens, self.rollout_max_response_len, self.rollout_max_context_len
        )
        return self

    @classmethod
    def of(cls, rollout: RolloutConfig) -> EpisodeSettings:
        """The settings of the run's `rollout` section."""
        sampling = SamplingParams(
            max_new_tokens=rollout.max_new_tokens,
            temperature=rollout.rollout_temperature,
            top_p=rollout.rollout_top_p,
            top_k=rollout.top_k,
            stop=rollout.stop,
        )
        return cls(
            max_turns=rollout.max_turns,
            rollout_max_response_len=rollout.rollout_max_response_len,
            rollout_max_context_len=rollout.rollout_max_context_len,
            sampling=sampling,
            max_staleness=rollout.max_staleness,
        )

    @property
    def behaviour(self) -> Behaviour:
        """What of these settings the learner needs, as the episode's trajectory carries it."""
        sampling = self.sampling
        return Behaviour(
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            min_p=sampling.min_p,
            max_staleness=self.max_staleness,
        )

    def sampled_with(self, **params: Any) -> EpisodeSettings:
        """These settings with some sampling params changed (an episode's `sampling_seed`, an evaluation's
        temperature 0), validated again."""
        sampling = {**self.sampling.model_dump(), **params}
        return EpisodeSettings.model_validate({**self.model_dump(), "sampling": sampling})


class EpisodeJob(BaseModel):
    """One episode to run: which environment, how to start it, how to sample, and which attempt this is."""

    model_config = ConfigDict(extra="forbid")

    episode_id: str = Field(min_length=1)
    group_id: str = Field(min_length=1)
    env: str = Field(
        min_length=1, description="registered env name, import path, http(s) URL, or openenv+ws(s) URL"
    )
    seed: int | None = None
    task_id: str | None = Field(default=None, description="a row of a split the env holds: SPLIT/INDEX")
    options: dict[str, Any] = Field(default_factory=dict)
    sample: dict[str, Any] | None = None
    settings: EpisodeSettings = Field(description="how the episode is played, whichever worker plays it")
    sampling_seed: int | None = Field(
        default=None, description="the seed of the engine's sampler for this episode (a group's differ)"
    )
    policy_version: int = Field(default=0, ge=0)
    attempt: int = Field(default=1, ge=1)
    errors: list[str] = Field(default_factory=list, description="one line per failed attempt, oldest first")


def group_jobs(
    env: str,
    starts: Sequence[Mapping[str, Any]],
    group_size: int,
    *,
    settings: EpisodeSettings,
    policy_version: int = 0,
    seed: int = 0,
    prefix: str = "ep",
) -> list[EpisodeJob]:
    """`group_size` jobs per start (a mapping of `START_KEYS`), one group each.

    Samples of a group share the start, the `settings` and a `group_id`, but get distinct `sampling_seed`s,
    drawn reproducibly from `seed`.
    """
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    unknown = {key for start in starts for key in start} - START_KEYS
    if unknown:
        raise ValueError(f"an episode start takes {', '.join(sorted(START_KEYS))}; got {sorted(unknown)}")
    seeds = iter(random.Random(seed).sample(range(2**31), len(starts) * group_size))
    return [
        EpisodeJob(
            episode_id=f"{prefix}-g{g}-s{s}",
            group_id=f"{prefix}-g{g}",
            env=env,
            seed=start.get("seed"),
            task_id=start.get("task_id"),
            options=dict(start.get("options") or {}),
            sample=start.get("sample"),
            settings=settings,
            sampling_seed=next(seeds),
            policy_version=policy_version,
        )
        for g, start in enumerate(starts)
        for s in range(group_size)
    ]
