"""An env server's sessions as a `gymnasium.Env` (`pip install 'vistarl[gym]'`; docs/client.md, "Gymnasium").

`GymEnv(url)` plays one session at a time through the blocking `EnvClient`: `reset(seed=, options=)`
starts a session (ending the one before) with the env's options, `step(text)` sends a reply, and the
answer's own fields make `(observation, reward, terminated, truncated, info)`: the wire's `reward`,
`terminated` (done, by the env's own rules), `truncated` (done, by a budget of the env) and `info`.

- The observation is `{"text": str, "images": (H x W x 3 uint8 arrays, ...)}`: a `Dict` of a `Text` space
  and a `Sequence` of `Box`es of one image shape.
- The action is the reply text: a `Text` space up to the server's `max_action_chars`.

A text env meets Gymnasium's spaces only so far: a `Text` space holds the characters of a finite
`charset` (printable ASCII here, unless given), so an env whose text leaves it (LaTeX symbols, other
scripts) returns observations outside the space, which the env checker reports; and a `Box` has one
shape, the first observation's (one session is reset and closed at construction) unless `image_shape`
says, so an env whose images change size does not fit either. A sampled action is random text: an env
answers it as the bad reply it is. Seeds are the env's own task seeds; `reset()` without one draws it
from `np_random`, so that a seeded first reset makes the whole sequence of episodes reproducible.
"""

from __future__ import annotations

import string
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces
from typing_extensions import Unpack

from vistarl.clients.http import ClientOptions, EnvClient
from vistarl.clients.images import decode_image
from vistarl.clients.protocol import Observation

__all__ = ["GymEnv", "GymObservation"]

GymObservation = dict[str, Any]
"""`{"text": str, "images": tuple of H x W x 3 uint8 arrays}`."""
SEED_RANGE = 2**31
"""Seeds `reset()` draws from `np_random` when it is given none."""


class GymEnv(gymnasium.Env[GymObservation, str]):
    """One env server's sessions, one at a time, as a Gymnasium env; `close()` ends the session and the
    client. `options` are the env's options for every reset (a reset's own `options` update them);
    `client` takes `EnvClient`'s keyword arguments (a token, timeouts, retries)."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(
        self,
        base_url: str | Sequence[str],
        *,
        options: Mapping[str, Any] | None = None,
        image_shape: tuple[int, int] | None = None,
        charset: str = string.printable,
        max_text_chars: int = 65_536,
        max_action_chars: int = 4096,
        **client: Unpack[ClientOptions],
    ) -> None:
        self.client = EnvClient(base_url, **client)
        self.options = dict(options or {})
        self.session_id: str | None = None
        limits = self.client.info().limits
        height, width = image_shape or self._first_image_shape()
        self.observation_space = spaces.Dict(
            {
                "text": spaces.Text(max_text_chars, min_length=0, charset=charset),
                "images": spaces.Sequence(spaces.Box(0, 255, (height, width, 3), np.uint8)),
            }
        )
        self.action_space = spaces.Text(
            min(max_action_chars, limits.max_action_chars), min_length=0, charset=charset
        )

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[GymObservation, dict[str, Any]]:
        """Start an episode from `seed` (else one drawn from `np_random`): its observation and info."""
        super().reset(seed=seed)
        self._end_session()
        task_seed = int(self.np_random.integers(SEED_RANGE)) if seed is None else seed
        start = self.client.reset(seed=task_seed, options={**self.options, **(options or {})})
        self.session_id = start.session_id
        return _observation(start.observation), start.info

    def step(self, action: str) -> tuple[GymObservation, float, bool, bool, dict[str, Any]]:
        """Send the reply text; the next observation and the wire's reward, terminated, truncated, info."""
        if self.session_id is None:
            raise RuntimeError("step before reset")
        answer = self.client.step(self.session_id, action, request_id=uuid.uuid4().hex)
        return (
            _observation(answer.observation),
            answer.reward,
            answer.terminated,
            answer.truncated,
            answer.info,
        )

    def close(self) -> None:
        """End the session and shut the client down; safe to call twice."""
        self._end_session()
        self.client.shutdown()

    def _first_image_shape(self) -> tuple[int, int]:
        """The (height, width) of the first image of a session reset with the env's options, then closed;
        (1, 1) for an env that shows none (its image sequences stay empty)."""
        start = self.client.reset(options=self.options)
        self.client.close(start.session_id)
        images = _observation(start.observation)["images"]
        return images[0].shape[:2] if images else (1, 1)

    def _end_session(self) -> None:
        session_id, self.session_id = self.session_id, None
        if session_id is not None:
            self.client.close(session_id)


def _observation(observation: Observation) -> GymObservation:
    """The wire's observation with each image as an H x W x 3 uint8 array."""
    images = tuple(np.asarray(decode_image(url).convert("RGB"), dtype=np.uint8) for url in observation.images)
    return {"text": observation.text, "images": images}
