"""An OpenEnv environment for the tests, served by openenv-core's own server: name the colour of a square.

    python -m tests.envs.openenv_colors --port 8000

An episode shows a square of one of `COLORS` (the reset's seed picks it) as a bare base64 PNG in `image`,
and asks which colour it is in `prompt`. A reply scores `reward(reply, colour)`; the episode ends when a
reply names the colour, or after `turns` turns (an argument of the reset, `TURNS` by default). Two
replies misbehave on purpose: `crash` makes the env raise (OpenEnv's error answer), and `stall` sleeps
`STALL_S` before answering, longer than a test waits.
"""

from __future__ import annotations

import argparse
import base64
import io
import time
from typing import Any

import uvicorn
from openenv.core.env_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from PIL import Image
from pydantic import Field

COLORS = {"red": (220, 30, 30), "green": (30, 180, 60), "blue": (40, 70, 220)}
SIZE = 56  # two 28-px patches a side: 4 image tokens after the merge
TURNS = 2
STALL_S = 5.0


def color_of(seed: int | None) -> str:
    """The colour of a seed's square."""
    return list(COLORS)[(seed or 0) % len(COLORS)]


def square(color: str) -> Image.Image:
    """The square an episode of `color` shows."""
    return Image.new("RGB", (SIZE, SIZE), COLORS[color])


def prompt(turn: int) -> str:
    """The question of turn `turn` (0 at the reset)."""
    return f"Turn {turn}. Which colour is the square: red, green or blue?"


def reward(reply: str, color: str) -> float:
    """1 for naming the colour; otherwise a small score that varies with the reply, so that a group's
    rewards differ."""
    if color in reply.lower():
        return 1.0
    return round(0.1 * (len(reply) % 5), 2)


class ColorAction(Action):
    """The reply."""

    message: str = Field(description="The reply text.")


class ColorObservation(Observation):
    """The question, the square (a bare base64 PNG) and the turn."""

    prompt: str
    image: str
    turn: int = 0


class ColorEnv(Environment[ColorAction, ColorObservation, State]):
    """One episode per session."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._color = color_of(0)
        self._turns = TURNS
        self._state = State(episode_id=None, step_count=0)

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, turns: int = TURNS, **kwargs: Any
    ) -> ColorObservation:
        self._color, self._turns = color_of(seed), turns
        self._state = State(episode_id=episode_id, step_count=0)
        return self._observation(reward=None, done=False)

    def step(self, action: ColorAction, timeout_s: float | None = None, **kwargs: Any) -> ColorObservation:
        if action.message == "crash":
            raise RuntimeError("the colour env crashed on purpose")
        if action.message == "stall":
            time.sleep(STALL_S)
        self._state.step_count += 1
        score = reward(action.message, self._color)
        return self._observation(reward=score, done=score == 1.0 or self._state.step_count >= self._turns)

    @property
    def state(self) -> State:
        return self._state

    def _observation(self, reward: float | None, done: bool) -> ColorObservation:
        png = io.BytesIO()
        square(self._color).save(png, format="PNG")
        return ColorObservation(
            prompt=prompt(self._state.step_count),
            image=base64.b64encode(png.getvalue()).decode("ascii"),
            turn=self._state.step_count,
            reward=reward,
            done=done,
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    app = create_app(ColorEnv, ColorAction, ColorObservation, env_name="colors", max_concurrent_envs=32)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
