"""The env contract: `step` returns a `StepResult`, and an env restored from `state()` continues identically.

Every step of every env below goes through `checked_step`, as the server steps it: an env whose `step`
returns anything but a `StepResult` (the old `(obs, done, info)` tuple, a reward hidden in the info)
fails here on its first step.

Every registered env (`vistarl.services.env_api.ENV_MODULES`, so an env is covered as soon as it registers)
and the test envs play random episodes. After the reset and after every step, the env's state goes through
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
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from vistarl.services.env_api import (
    ENV_MODULES,
    Env,
    EnvFactory,
    EnvObservation,
    StepResult,
    checked_step,
    load_env_factory,
)
from vistarl.services.server.encoding import json_safe, observation_to_wire
from vistarl.services.server.env_calls import decode_state, encode_state

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
    """One step, as the server would answer it: observation, done, reward, terminated, truncated, info."""
    result = checked_step(env, action)
    assert "reward" not in result.info, "the turn reward is `StepResult.reward`, not an info key"
    wire = observation_to_wire(result.observation).model_dump()
    return wire, result.done, result.reward, result.terminated, result.truncated, json_safe(result.info)


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


class EchoEnv(Env[ForeignOptions]):
    """An env that writes only what the base leaves to it: reset, step and its part of the state."""

    def __init__(self, seed: int | None) -> None:
        self.options, self.seed, self.turns = ForeignOptions(), seed, 0

    def reset(self) -> tuple[EnvObservation, dict[str, Any]]:
        return {"text": "say something", "images": []}, {}

    def step(self, response_text: str) -> StepResult:
        self.turns += 1
        return StepResult({"text": response_text, "images": []}, 0.0, terminated=True)

    def state(self) -> dict[str, Any]:
        return {**super().state(), "turns": self.turns}


def test_an_env_takes_the_bases_defaults_and_must_write_reset_and_step() -> None:
    env = EchoEnv(seed=4)
    observation, _ = env.reset()
    assert env.format_observation(observation) == {
        "role": "user",
        "content": [{"type": "text", "text": "say something"}],
    }
    checked_step(env, "hello")
    env.close()
    env.close()
    assert env.state() == {"options": {}, "seed": 4, "turns": 1}

    class NoStep(Env[ForeignOptions]):
        def reset(self) -> tuple[EnvObservation, dict[str, Any]]:
            return {"text": "", "images": []}, {}

    with pytest.raises(TypeError, match="step"):
        NoStep()  # type: ignore[abstract]


class TupleEnv:
    """An env that still returns the old `(obs, done, info)` tuple, its reward hidden in the info."""

    def step(self, response_text: str) -> tuple[EnvObservation, bool, dict[str, Any]]:
        return {"text": "", "images": []}, True, {"reward": 1.0}


def test_a_step_that_is_not_a_step_result_fails_naming_the_env() -> None:
    with pytest.raises(TypeError, match=r"TupleEnv\.step returned tuple, not a StepResult"):
        checked_step(TupleEnv(), "anything")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"reward": None}, "reward must be a number"),
        ({"reward": True}, "reward must be a number"),
        ({"reward": float("nan")}, "reward must be finite"),
        ({"terminated": 1}, "terminated must be a bool"),
        ({"truncated": None}, "truncated must be a bool"),
    ],
)
def test_a_step_result_refuses_a_reward_or_flag_of_the_wrong_kind(fields: dict[str, Any], error: str) -> None:
    with pytest.raises((TypeError, ValueError), match=error):
        StepResult(
            **{"observation": {"text": "", "images": []}, "reward": 0.0, "terminated": False, **fields}
        )


def test_an_env_whose_dependency_is_missing_names_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "env_needing_more.py").write_text("import no_such_dependency_of_an_env\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match="'env_needing_more' needs 'no_such_dependency_of_an_env'"):
        load_env_factory("env_needing_more")
    with pytest.raises(ValueError, match="unknown environment 'no_such_env_module'"):
        load_env_factory("no_such_env_module")
