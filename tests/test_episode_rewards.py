"""Rewards that add up: on every registered env, an episode's turn rewards plus the last step's `end_reward`
are its `episode_reward` (docs/envs.md, "Rewards"), and on Geo3k and VSI `end_reward` is 0, so that the
turn rewards alone add up there. The episodes are seeded: the env's own random player, and on Sokoban also
the solver's moves, so that the formula's +5 for a solved level is in play beside the distance term."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable
from typing import Any

import pytest

from vistarl.services.env_api import ENV_MODULES, Env, EnvFactory, checked_step, load_env_factory
from vistarl.services.sokoban.env import SokobanEnv
from vistarl.services.sokoban.solver import solve

pytestmark = pytest.mark.usefixtures("geo3k_graders")
EPISODES = {"sokoban": 200, "geo3k": 60, "vsi": 20}
"""Seeded episodes per env (VSI renders a view a turn, so fewer)."""
OPTIONS: dict[str, dict[str, Any]] = {"sokoban": {"max_steps": 30}, "vsi": {"image_size": 64, "max_turns": 6}}
SUMS_UP = frozenset({"geo3k", "vsi"})
"""The envs whose turn rewards add up to the episode reward by themselves."""

Reply = Callable[[str], str]


def player(factory: EnvFactory, env: Env, seed: int) -> Reply:
    """The replies of episode `seed`: the solver's moves, three a turn, on every other Sokoban seed, else the
    env's random player (which reads the conversation's text)."""
    if isinstance(env, SokobanEnv) and seed % 2 == 0:
        moves = iter(solve(env.level).moves or [])
        return lambda _: f"<answer>{', '.join(itertools.islice(moves, 3))}</answer>"
    assert factory.random_reply is not None, f"{factory.name} has no random player"
    rng, random_reply = random.Random(seed), factory.random_reply
    return lambda conversation: random_reply(conversation, rng)


def play(name: str, seed: int) -> tuple[list[float], dict[str, Any]]:
    """One seeded episode to its end: its turn rewards, and the last step's info."""
    factory = load_env_factory(name)
    env = factory.create(factory.options_model.model_validate(OPTIONS.get(name, {})), seed, None)
    observation, _ = env.reset()
    reply, conversation, rewards = player(factory, env, seed), observation["text"], []
    while True:
        result = checked_step(env, reply(conversation))
        rewards.append(result.reward)
        if result.done:
            env.close()
            return rewards, result.info
        assert "end_reward" not in result.info, "end_reward comes with the last step only"
        conversation += "\n" + result.observation["text"]


@pytest.mark.parametrize("name", sorted(ENV_MODULES))
def test_the_turn_rewards_and_end_reward_add_up_to_the_episode_reward(name: str) -> None:
    ends = []
    for seed in range(EPISODES[name]):
        rewards, info = play(name, seed)
        assert math.isclose(sum(rewards) + info["end_reward"], info["episode_reward"], abs_tol=1e-9), (
            f"{name} seed {seed}: turn rewards {rewards}, info {info}"
        )
        ends.append(info["end_reward"])
    if name in SUMS_UP:
        assert all(end == 0.0 for end in ends), ends
    else:
        assert len({round(end, 6) for end in ends}) > 2, f"{name}'s end_reward never varied: {ends}"


def test_sokobans_end_reward_is_what_the_seeds_formula_adds_to_the_turn_rewards() -> None:
    """mean + 5·solved + (dist0 − dist1), less the sum: the +5 of a solved level shows in end_reward."""
    solved, unsolved = play("sokoban", 0), play("sokoban", 1)
    for rewards, info in (solved, unsolved):
        metrics = info["metrics"]
        formula = sum(rewards) / len(rewards) + 5 * metrics["success"] + metrics["dist0"] - metrics["dist1"]
        assert info["episode_reward"] == pytest.approx(formula)
        assert info["end_reward"] == pytest.approx(formula - sum(rewards))
    assert solved[1]["success"] and not unsolved[1]["success"]
