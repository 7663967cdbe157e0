"""A tiny test environment: count to `target` by sending "inc".

Loaded by import path (`load_env_factory("tests.envs.counter")`). Each observation carries a small
image whose colour encodes the count, so image encoding is exercised. `step_delay_s` makes every step
sleep (for concurrency and slow-episode tests), `fail_on` makes a step raise (for crash handling),
`refuse` makes the constructor reject its options, `chatty` makes every step print to stdout (which an env
worker process must keep off its frames), and `close_marker` / `step_marker` name files that `close()` /
the start of a step create (to observe shutdown, and to know that a step is running). `in_step_dir` counts
the steps that run at once, across threads and env worker processes: each holds a file there while it runs,
first waits for `meet` of them to (a rendezvous, bounded), and reports both counts in its info.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from PIL import Image
from pydantic import BaseModel, ConfigDict, Field

from vistarl.services.env_api import Env, EnvFactory, EnvObservation, StepResult

BAD_ACTION_PENALTY = -0.1
MEET_WAIT_S = 60.0
"""The longest a step waits for `meet` steps to run at once before it goes on without them."""


class CounterOptions(BaseModel):
    """Options of the counter env; unknown fields are rejected."""

    model_config = ConfigDict(extra="forbid")

    target: int = Field(default=3, ge=1, le=1000, description="Count at which the episode ends.")
    step_delay_s: float = Field(default=0.0, ge=0.0, le=60.0, description="Sleep inside every step.")
    image_size: int = Field(default=8, ge=1, le=512, description="Side of the square observation image.")
    fail_on: str | None = Field(default=None, description="An action that makes the step raise.")
    close_marker: str | None = Field(default=None, description="A file created when the env is closed.")
    step_marker: str | None = Field(default=None, description="A file created when a step starts.")
    refuse: str | None = Field(default=None, description="Makes the constructor raise ValueError(refuse).")
    chatty: bool = Field(default=False, description="Print a line to stdout at every step.")
    in_step_dir: str | None = Field(default=None, description="A directory where a step holds a file.")
    meet: int = Field(default=1, ge=1, le=64, description="Steps running at once before a step goes on.")


class CounterEnv(Env[CounterOptions]):
    """Counts "inc" actions; anything else is answered with feedback and a penalty, as a game would."""

    def __init__(self, options: CounterOptions, seed: int | None) -> None:
        if options.refuse is not None:
            raise ValueError(options.refuse)
        self.options = options
        self.seed = seed
        self.count = self.start
        self.steps = 0
        self.total_reward = 0.0

    def reset(self) -> tuple[EnvObservation, dict[str, Any]]:
        self.count, self.steps, self.total_reward = self.start, 0, 0.0
        return self._observe("start"), {"target": self.options.target}

    def step(self, response_text: str) -> StepResult:
        if self.options.step_marker is not None:
            Path(self.options.step_marker).touch()
        with _running_steps(self.options) as running:
            if self.options.step_delay_s:
                time.sleep(self.options.step_delay_s)
        if self.options.chatty:
            print(f"counter env stepping with {response_text!r}", flush=True)
        if self.options.fail_on is not None and response_text == self.options.fail_on:
            raise RuntimeError(f"counter env was told to fail on {response_text!r}")
        self.steps += 1
        valid = response_text.strip().lower() == "inc"
        reward = 1.0 if valid else BAD_ACTION_PENALTY
        self.count += int(valid)
        self.total_reward += reward
        done = self.count >= self.options.target
        info: dict[str, Any] = {"valid": valid, **running}
        if done:
            info["episode_reward"] = self.total_reward
            info["metrics"] = {"steps": self.steps, "success": 1.0}
        observation = self._observe("ok" if valid else f"unknown action {response_text[:20]!r}")
        return StepResult(observation, reward, terminated=done, info=info)

    @property
    def start(self) -> int:
        """The count an episode starts from: the seed's."""
        return self.seed or 0

    def close(self) -> None:
        if self.options.close_marker is not None:
            Path(self.options.close_marker).touch()

    def state(self) -> dict[str, Any]:
        """Options, seed, count and step counters: all the episode is."""
        return {
            **super().state(),
            "count": self.count,
            "steps": self.steps,
            "total_reward": self.total_reward,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> CounterEnv:
        env = cls(CounterOptions.model_validate(state["options"]), state["seed"])
        env.count, env.steps, env.total_reward = state["count"], state["steps"], state["total_reward"]
        return env

    def _observe(self, feedback: str) -> EnvObservation:
        """Text with the count and step number, plus an image whose red channel is the count."""
        side = self.options.image_size
        image = Image.new("RGB", (side, side), (self.count % 256, 0, 0))
        text = f"count={self.count} steps={self.steps} target={self.options.target} ({feedback})"
        return EnvObservation(text=text, images=[image])


@contextlib.contextmanager
def _running_steps(options: CounterOptions) -> Iterator[dict[str, int]]:
    """With `in_step_dir`, hold a file there for the block, after waiting (at most `MEET_WAIT_S`) until
    `meet` steps hold one; yields `{"met": steps running when this one went on, "running": as it ended}`,
    filled in by the block's end."""
    counts: dict[str, int] = {}
    if options.in_step_dir is None:
        yield counts
        return
    folder = Path(options.in_step_dir)
    mine = folder / uuid.uuid4().hex
    mine.touch()
    try:
        deadline = time.monotonic() + MEET_WAIT_S
        while (held := len(list(folder.iterdir()))) < options.meet and time.monotonic() < deadline:
            time.sleep(0.01)
        counts["met"] = held
        yield counts
        counts["running"] = len(list(folder.iterdir()))
    finally:
        mine.unlink()


def _create(options: BaseModel, seed: int | None, sample: BaseModel | None) -> CounterEnv:
    assert isinstance(options, CounterOptions)
    return CounterEnv(options, seed)


ENV_FACTORY = EnvFactory(
    name="counter",
    version="1.0",
    description="Count to a target by sending 'inc'.",
    system_prompt="You are counting. Answer with 'inc' to add one.",
    action_format="inc",
    options_model=CounterOptions,
    create=_create,
    restore=CounterEnv.from_state,
)
