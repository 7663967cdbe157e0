"""The project's Sokoban served by OpenEnv's own server (`openenv-core`), the peer `benchmarks.env_server
--openenv` measures `vistarl serve sokoban` against.

    .venv/bin/python -m benchmarks.openenv_sokoban --port 8000 [--max-sessions 128]

Each WebSocket session (`/ws`) gets its own `SokobanEnv`, built at every reset (a new level, or the
level of the reset's `seed`), and stepped with the response text as `vistarl serve` steps it. An
observation carries what `vistarl serve` answers: the text, the image as a PNG data URL, the
observation's metadata and the step's info as plain JSON, with the turn reward and `done`. The server is
`openenv.core.env_server.create_app` under uvicorn, as OpenEnv's own template runs it. `openenv-core` is
not a dependency of the project: `pip install openenv-core` to run this.
"""

from __future__ import annotations

import argparse
import uuid
from typing import Any

import uvicorn
from openenv.core.env_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

from vistarl.services.server.encoding import json_safe, observation_to_wire
from vistarl.services.sokoban import SokobanEnv, SokobanOptions


class SokobanAction(Action):
    """One model response, as `POST /step`'s `action`."""

    action: str = Field(description="The response text: moves in <answer>...</answer>.")


class SokobanObservation(Observation):
    """What `vistarl serve` answers for a reset or a step, in OpenEnv's observation shape."""

    text: str = ""
    images: list[str] = Field(default_factory=list)
    observation_metadata: dict[str, Any] = Field(default_factory=dict)
    info: dict[str, Any] = Field(default_factory=dict)


class OpenEnvSokoban(Environment[SokobanAction, SokobanObservation, State]):
    """`SokobanEnv` behind OpenEnv's `Environment` interface, one per session."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._env: SokobanEnv | None = None
        self._state = State(episode_id=None, step_count=0)

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> SokobanObservation:
        """A new episode: the level of `seed`, or a random one."""
        self._env = SokobanEnv(SokobanOptions(), seed)
        self._state = State(episode_id=episode_id or uuid.uuid4().hex, step_count=0)
        obs, info = self._env.reset()
        return _observation(obs, info, reward=None, done=False)

    def step(
        self, action: SokobanAction, timeout_s: float | None = None, **kwargs: Any
    ) -> SokobanObservation:
        """One turn of the episode."""
        if self._env is None:
            raise RuntimeError("reset before stepping")
        result = self._env.step(action.action)
        self._state.step_count += 1
        return _observation(result.observation, result.info, reward=result.reward, done=result.done)

    @property
    def state(self) -> State:
        return self._state


def _observation(obs: Any, info: dict[str, Any], reward: float | None, done: bool) -> SokobanObservation:
    """The env's observation encoded as `vistarl serve` encodes it (`observation_to_wire`, `json_safe`)."""
    wire = observation_to_wire(obs)
    return SokobanObservation(
        text=wire.text,
        images=wire.images,
        observation_metadata=wire.metadata,
        info=json_safe(info),
        reward=reward,
        done=done,
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-sessions", type=int, default=128, help="OpenEnv's max_concurrent_envs.")
    args = parser.parse_args()
    app = create_app(
        OpenEnvSokoban,
        SokobanAction,
        SokobanObservation,
        env_name="sokoban",
        max_concurrent_envs=args.max_sessions,
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
