"""`vistarl.clients.gym.GymEnv` on a real `vistarl serve sokoban`: Gymnasium's own env checker passes, an
episode's `(obs, reward, terminated, truncated, info)` are the wire's own fields for the same seed and
replies, a text outside the space's charset is what the checker refuses, and no session outlives the reset
that replaced it or the env's close (docs/client.md, "Gymnasium")."""

from __future__ import annotations

import string
import subprocess
import sys
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from tests.envs.serving import served
from vistarl.clients.gym import GymEnv
from vistarl.clients.http import EnvClient
from vistarl.clients.images import decode_image
from vistarl.services.sokoban.game import Level
from vistarl.services.sokoban.solver import solve

SMALL = {"cell_size": 16}  # 96 x 96 images


@pytest.fixture(scope="module")
def sokoban() -> Iterator[str]:
    with served("sokoban", "--env-workers", "0") as url:
        yield url


def test_gymnasiums_env_checker_passes(sokoban: str) -> None:
    env = GymEnv(sokoban, options=SMALL, token="")
    try:
        assert env.observation_space["images"].feature_space.shape == (96, 96, 3)
        check_env(env, skip_render_check=True)
    finally:
        env.close()


def test_a_solved_episode_gives_the_wires_own_fields(sokoban: str) -> None:
    with EnvClient(sokoban, token="") as client:
        wire = client.reset(seed=9, options=SMALL)
        moves = solve(Level.from_xsb(wire.info["level"])).moves
        assert moves is not None
        replies = [f"<answer>{', '.join(moves[at : at + 3])}</answer>" for at in range(0, len(moves), 3)]
        answers = [client.step(wire.session_id, reply) for reply in replies]
    env = GymEnv(sokoban, options=SMALL, token="")
    try:
        observation, info = env.reset(seed=9)
        assert observation["text"] == wire.observation.text and info == wire.info
        (image,) = observation["images"]
        expected = np.asarray(decode_image(wire.observation.images[0]).convert("RGB"))
        assert image.dtype == np.uint8 and np.array_equal(image, expected)
        for reply, answer in zip(replies, answers, strict=True):
            observation, reward, terminated, truncated, info = env.step(reply)
            assert observation["text"] == answer.observation.text
            assert (reward, terminated, truncated, info) == (
                answer.reward,
                answer.terminated,
                answer.truncated,
                answer.info,
            )
        assert terminated and not truncated and info["success"]
    finally:
        env.close()


def test_the_step_cap_truncates_and_a_seedless_reset_follows_the_first_seed(sokoban: str) -> None:
    env = GymEnv(sokoban, options={**SMALL, "max_steps": 2}, token="")
    try:
        env.reset(seed=4)
        outcomes = [env.step("<answer>Up</answer>")[2:4] for _ in range(2)]
        assert outcomes == [(False, False), (False, True)]
        first = [env.reset(seed=7)[1]["seed"], env.reset()[1]["seed"], env.reset()[1]["seed"]]
        again = [env.reset(seed=7)[1]["seed"], env.reset()[1]["seed"], env.reset()[1]["seed"]]
        assert first == again and first[0] == 7 and len(set(first)) == 3
    finally:
        env.close()


def live_sessions(url: str) -> int:
    """The sessions the server holds now."""
    return int(httpx.get(f"{url}/ready").json()["active_sessions"])


def test_a_reset_ends_the_session_before_and_close_ends_the_last(sokoban: str) -> None:
    assert live_sessions(sokoban) == 0
    env = GymEnv(sokoban, options=SMALL, token="")
    try:
        assert live_sessions(sokoban) == 0  # the session that measured the images is closed
        seen = []
        for seed in (1, 2, 3):
            env.reset(seed=seed)
            env.step("<answer>Up</answer>")
            seen.append(env.session_id)
            assert live_sessions(sokoban) == 1
        assert len(set(seen)) == 3
    finally:
        env.close()
    assert live_sessions(sokoban) == 0
    env.close()  # a second close is no error
    assert live_sessions(sokoban) == 0


def test_a_text_outside_the_charset_is_what_the_checker_refuses(sokoban: str) -> None:
    env = GymEnv(sokoban, options=SMALL, charset=string.ascii_letters + " ", token="")
    try:
        with pytest.raises(AssertionError, match="not within the observation space"):
            check_env(env, skip_render_check=True)
    finally:
        env.close()


def test_the_gym_wrapper_imports_no_torch() -> None:
    code = "import sys, vistarl.clients.gym; assert 'torch' not in sys.modules, 'clients.gym imported torch'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
