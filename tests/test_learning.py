"""GRPO through the real loop raises a reward a random-init tiny model can learn: the share of even token ids.

The loop, the in-process `HFEngine` (synced after every step), the memory queue and the in-process
workers are all the real ones; only the environment is this module's tiny single-turn one, run in
process, and the reward is `even_token_reward` (a custom reward path) over the episode's generated ids.
Replies end at the first space the model writes, so they finish with `stop` and get scored (a reply
cut by `max_new_tokens` ends TRUNCATED before the env sees it, with reward 0).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict

from vistarl.services.env_api import Env, EnvFactory, EnvObservation, StepResult
from vistarl.trainer.config import TrainConfig
from vistarl.trainer.run.train import run_training


def even_token_reward(turn_rewards: Sequence[float], info: Mapping[str, Any]) -> float:
    """The share of generated token ids that are even."""
    ids = info["generated_ids"]
    return sum(1 for token in ids if token % 2 == 0) / len(ids) if ids else 0.0


class _NoOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")


class OneTurnEnv(Env[_NoOptions]):
    """Asks for a reply once, accepts whatever comes, and ends."""

    def __init__(self, seed: int | None) -> None:
        self.options = _NoOptions()
        self.seed = seed

    def reset(self) -> tuple[EnvObservation, dict[str, Any]]:
        return EnvObservation(text="Write anything.", images=[]), {}

    def step(self, response_text: str) -> StepResult:
        return StepResult(EnvObservation(text="Thanks.", images=[]), 0.0, terminated=True)


ENV_FACTORY = EnvFactory(
    name="one-turn",
    version="1.0",
    description="One free-text reply per episode.",
    system_prompt="",
    action_format="any text",
    options_model=_NoOptions,
    create=lambda options, seed, sample: OneTurnEnv(seed),
    restore=lambda state: OneTurnEnv(state["seed"]),
)


def learning_config(checkpoint: Path, run_dir: Path, steps: int) -> TrainConfig:
    """GRPO on `OneTurnEnv` with the tiny model on CPU: 4 prompts x 8 samples per step, 4 optimizer steps.

    Sampling from the top 16 tokens lets a few steps reorder what the policy writes: a near-uniform
    distribution over 152k tokens would need far larger logit changes to shift its even-id share.
    """
    return TrainConfig.model_validate(
        {
            "model": {"path": str(checkpoint), "dtype": "float32", "gradient_checkpointing": False},
            "env": {"name": __name__, "serve": False, "reward_path": f"{__name__}:even_token_reward"},
            "rollout": {
                "n_samples_per_prompt": 8,
                "rollout_batch_size": 4,
                "max_turns": 1,
                "max_new_tokens": 16,
                "rollout_max_response_len": 16,
                "rollout_max_context_len": 256,
                "rollout_temperature": 1.0,
                "top_k": 16,
                "concurrency": 32,
                "stop": [" "],
            },
            "algo": {"advantage_estimator": "grpo", "loss_agg_mode": "token-mean", "tis_cap": None},
            "optim": {"lr": 3e-3, "grad_clip": 1.0},
            "train": {
                "steps": steps,
                "global_batch_size": 8,
                "micro_batch_tokens": 2048,
                "run_dir": str(run_dir),
            },
            "logging": {"tensorboard": False},
        }
    )


@pytest.mark.slow  # a learning curve: minutes of CPU
async def test_grpo_raises_the_share_of_even_tokens(tiny_qwen25: Path, tmp_path: Path) -> None:
    result = await run_training(learning_config(tiny_qwen25, tmp_path / "run", steps=8))
    rewards = [record["reward/mean"] for record in result.history]
    assert len(rewards) == 8
    assert 0.3 < rewards[0] < 0.7, f"a random policy should start near 0.5: {rewards}"
    assert sum(rewards[-2:]) / 2 > rewards[0] + 0.15, f"GRPO did not learn: {rewards}"
    diffs = [record["train/logprob_abs_diff"] for record in result.history]
    assert max(diffs) < 1e-3, f"engine and trainer disagree, so the weights did not sync: {diffs}"
