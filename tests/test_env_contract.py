"""The env contract's state export and import: an env restored from `state()` continues identically.

Every registered env (`services.env_api.ENV_MODULES`, so an env is covered as soon as it registers) and
the test envs play random episodes. After the reset and after every step, the env's state goes through
msgpack as the shared session store keeps it (`encode_state`, `decode_state`), and `restore` rebuilds a
twin from it. Original and twin take the same next action and must give the same observation (as the
server would send it: text, PNG data URLs, metadata), done and info, and states equal again after it.
The episode goes on with the twin, so that restoring a restored env is checked too; an action that ends
it before `MIN_TURNS` is checked, then the episode goes on from the state before it (restored once more),
so that every env plays long episodes whatever share of its actions end one.
"""

from __future__ import annotations

import random
import re
from typing import Any

import pytest
from pydantic import BaseModel

from services.env_api import ENV_MODULES, Env, EnvFactory, load_env_factory
from services.server.encoding import json_safe, observation_to_wire
from services.server.env_work import decode_state, encode_state

TEST_ENVS = ("tests.envs.counter", "tests.envs.quiz")
# Geo3k grades in processes of its own: started first, so that original and twin never differ by one
# grading that timed out waiting for a process to start on a loaded machine.
pytestmark = pytest.mark.usefixtures("geo3k_graders")
SEEDS = (0, 1, 2)
MIN_TURNS = 8
MAX_TURNS = 100


def candidate_actions(factory: EnvFactory) -> list[str]:
    """Responses made from the env's own `action_format` (its words, bare and inside each of its tags,
    and the format itself) plus noise: valid and invalid actions for any env, without a table per env."""
    tags = sorted(set(re.findall(r"<(\w+)>", factory.action_format)))
    words = sorted(set(re.findall(r"[A-Za-z_]\w*", factory.action_format)) - set(tags))
    tagged = [f"<{tag}>{word}</{tag}>" for tag in tags for word in words]
    return [factory.action_format, *words, *tagged, "", "?!"]


def play(env: Env, action: str) -> tuple[Any, ...]:
    """One step, as the server would answer it."""
    obs, done, info = env.step(action)
    return observation_to_wire(obs).model_dump(), done, json_safe(info)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", [*sorted(ENV_MODULES), *TEST_ENVS])
def test_an_env_restored_from_its_state_continues_identically(name: str, seed: int) -> None:
    factory = load_env_factory(name)
    actions = candidate_actions(factory)
    rng = random.Random(f"{name}/{seed}")
    env = factory.create(factory.options_model.model_validate({}), seed, None)
    env.reset()
    for turn in range(MAX_TURNS):
        state = encode_state(env)
        twin = factory.restore(decode_state(state))
        action = rng.choice(actions)
        expected, got = play(env, action), play(twin, action)
        assert got == expected, f"{name}, seed {seed}, turn {turn}, action {action!r}"
        assert decode_state(encode_state(twin)) == decode_state(encode_state(env))
        done = bool(expected[1])
        if done and turn < MIN_TURNS:
            twin.close()
            twin, done = factory.restore(decode_state(state)), False
        env.close()
        env = twin
        if done:
            break
    env.close()


class ForeignOptions(BaseModel):
    """Options that no env declares."""


@pytest.mark.parametrize("name", sorted(ENV_MODULES))
def test_an_env_refuses_options_of_another_model_and_a_step_before_reset(name: str) -> None:
    factory = load_env_factory(name)
    with pytest.raises(TypeError, match=factory.options_model.__name__):
        factory.create(ForeignOptions(), 0, None)
    env = factory.create(factory.options_model.model_validate({}), 0, None)
    with pytest.raises(RuntimeError, match=r"reset\(\) before step\(\)"):
        env.step(factory.action_format)
    env.close()
