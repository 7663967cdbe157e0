"""PPO with a critic raises a reward a random-init tiny model can learn, through the real loop: GAE on
`tests.test_learning`'s one-turn task, and bi-level turn GAE on a two-turn one.

As in `tests/test_learning.py`, the loop, the in-process `HFEngine`, the queue, the workers, the trainer
and its critic are the real ones; only the environments are tiny test ones, run in process. The
one-turn task is scored by `signed_even_token_reward`, +1 per even token id and -1 per odd one,
averaged. This module's env (`TwoTurnEnv`) asks for a word twice and rewards each turn on its own:
+1 when the reply starts with a character whose code point is even, else -1, so turn-level credit is
what the critic must learn. A random policy scores about 0 on both, the critic's starting value, so
its first advantages already point the right way. With the plain share of even tokens (0 to 1)
instead, every sampled token gets a positive advantage until the critic catches up, and GAE had
not learned after 6 steps for one seed of eight. Sampling from the top 16 tokens makes
either task learnable in a few steps (see `learning_config`).

Measured on the 2-core box, from the first step's mean reward to the mean of steps 4 and 5: GAE
gained 0.62 to 0.99 (10 seeds) and turn GAE 0.72 to 1.19 (9 seeds), and the critic's mean value rose
by 0.43 or more and 0.32 or more. Under a fixed policy the mean reward of a step (32 episodes) varies
by about 0.1 for GAE's task and 0.13 for the two-turn one, so a gain of `GAIN` is about three of
those above chance and well below what learning gives.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.test_learning import ENV_FACTORY as ONE_TURN_FACTORY
from tests.test_learning import OneTurnEnv, even_token_reward, learning_config
from tests.test_train_loop import with_changes
from vistarl.services.env_api import EnvObservation, StepResult
from vistarl.trainer.config import TrainConfig
from vistarl.trainer.run.train import TrainResult, run_training

TURNS = 2
GAIN = 0.4


def signed_even_token_reward(turn_rewards: Sequence[float], info: Mapping[str, Any]) -> float:
    """`even_token_reward` as +1 per even generated token id and -1 per odd one, averaged."""
    return 2 * even_token_reward(turn_rewards, info) - 1


def even_start(text: str) -> float:
    """1 when `text` starts with a character whose code point is even, else -1 (an empty reply too)."""
    return 1.0 if text and ord(text[0]) % 2 == 0 else -1.0


class TwoTurnEnv(OneTurnEnv):
    """Asks for a word `TURNS` times; each reply's turn reward is `even_start`, the episode's their mean."""

    def __init__(self, seed: int | None, rewards: list[float] | None = None) -> None:
        super().__init__(seed)
        self.rewards = rewards or []

    def reset(self) -> tuple[EnvObservation, dict[str, Any]]:
        self.rewards = []
        return EnvObservation(text="Write a word.", images=[]), {}

    def step(self, response_text: str) -> StepResult:
        self.rewards.append(even_start(response_text))
        done = len(self.rewards) == TURNS
        info: dict[str, Any] = {"episode_reward": sum(self.rewards) / TURNS} if done else {}
        return StepResult(EnvObservation(text="Another one.", images=[]), self.rewards[-1], done, info=info)

    def state(self) -> dict[str, Any]:
        return {**super().state(), "rewards": self.rewards}


ENV_FACTORY = dataclasses.replace(
    ONE_TURN_FACTORY,
    name="two-turn",
    description="Two words per episode, each rewarded for starting with a character of even code point.",
    action_format="a word",
    create=lambda options, seed, sample: TwoTurnEnv(seed),
    restore=lambda state: TwoTurnEnv(state["seed"], state["rewards"]),
)


def critic_config(cfg: TrainConfig, estimator: str) -> TrainConfig:
    """`cfg` trained by PPO with a critic (`estimator`): 2 mini-batches a step, the critic at 1e-3."""
    cfg = with_changes(cfg, "algo", advantage_estimator=estimator)
    cfg = with_changes(cfg, "optim", critic_lr=1e-3)
    return with_changes(cfg, "train", global_batch_size=16)


def assert_learned(result: TrainResult, steps: int) -> None:
    """The reward rose by `GAIN`, the critic's values rose, the engine served the trainer's weights."""
    history = result.history
    rewards = [record["reward/mean"] for record in history]
    assert len(rewards) == steps
    assert -0.4 < rewards[0] < 0.4, f"a random policy should start near 0: {rewards}"
    assert sum(rewards[-2:]) / 2 > rewards[0] + GAIN, f"PPO did not learn: {rewards}"
    values = [record["train/value_mean"] for record in history]
    assert values[-1] > values[0] + 0.2, f"the critic, from 0, should climb toward the returns: {values}"
    diffs = [record["train/logprob_abs_diff"] for record in history]
    assert max(diffs) < 1e-3, f"engine and trainer disagree, so the weights did not sync: {diffs}"


@pytest.mark.slow  # a learning curve: minutes of CPU
async def test_ppo_with_gae_raises_the_share_of_even_tokens(tiny_qwen25: Path, tmp_path: Path) -> None:
    cfg = critic_config(learning_config(tiny_qwen25, tmp_path / "run", steps=5), "gae")
    cfg = with_changes(cfg, "env", reward_path=f"{__name__}:signed_even_token_reward")
    assert_learned(await run_training(cfg), steps=5)


@pytest.mark.slow  # a learning curve: minutes of CPU
async def test_turn_gae_raises_the_turn_rewards_of_a_two_turn_task(tiny_qwen25: Path, tmp_path: Path) -> None:
    cfg = critic_config(learning_config(tiny_qwen25, tmp_path / "run", steps=5), "turn_gae")
    cfg = with_changes(cfg, "env", name=__name__, reward_path=None)
    cfg = with_changes(cfg, "rollout", max_turns=TURNS, rollout_max_response_len=32)
    assert_learned(await run_training(cfg), steps=5)
