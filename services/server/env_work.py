"""What an env call does, from arguments to the JSON body the client gets: the work both env pools run.

`EnvHost` keeps the live envs of the sessions it hosts, by session id, and answers `start`, `step`,
`close` and `format` with ready-to-send JSON bytes: observations are encoded (PNG data URLs, plain-JSON
info) where the env ran, in the server's threads or in an env worker process, never on the event loop.
The session rules (capacity, ordering, retries, expiry) are `services.server.sessions`' business, not this.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel
from pydantic_core import to_json

from clients.images import ImageError
from clients.protocol import ErrorCode, FormatResponse, Observation, ResetResponse, StepResponse
from services.env_api import Env, EnvFactory
from services.server.encoding import json_safe, message_to_wire, observation_from_wire, observation_to_wire
from services.server.errors import ServiceError

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class Task:
    """What a new episode starts from: validated options, and a seed or a validated sample (or neither)."""

    options: BaseModel
    seed: int | None = None
    sample: BaseModel | None = None


class EnvHost:
    """The envs of one pool (or one worker process), and the four calls on them.

    Each method runs synchronously; the caller makes sure one session sees one call at a time.
    """

    def __init__(self, factory: EnvFactory, max_image_bytes: int, max_image_pixels: int) -> None:
        self.factory = factory
        self.image_limits = {"max_bytes": max_image_bytes, "max_pixels": max_image_pixels}
        self.envs: dict[str, Env] = {}
        self._formatter: Env | None = None

    def start(self, session_id: str, task: Task, with_message: bool) -> bytes:
        """Build and reset an env for `session_id` from its task; the `ResetResponse` body.

        The env's own ValueError on its options or sample is the caller's fault (422).
        """
        try:
            env = self.factory.create(task.options, task.seed, task.sample)
        except ValueError as exc:
            code = ErrorCode.INVALID_OPTIONS if task.sample is None else ErrorCode.INVALID_SAMPLE
            what = "options" if task.sample is None else "task"
            raise ServiceError(code, f"{what} rejected by {self.factory.name}: {exc}") from exc
        try:
            obs, info = env.reset()
            body = to_json(
                ResetResponse(
                    session_id=session_id,
                    observation=observation_to_wire(obs),
                    info=json_safe(info),
                    message=message_to_wire(env.format_observation(obs)) if with_message else None,
                )
            )
        except BaseException:
            env.close()
            raise
        self.envs[session_id] = env
        return body

    def step(self, session_id: str, action: str, with_message: bool) -> tuple[bool, bytes]:
        """One env step: whether the episode is done, and the `StepResponse` body (turn reward from
        `info["reward"]`)."""
        env = self.envs[session_id]
        obs, done, info = env.step(action)
        response = StepResponse(
            observation=observation_to_wire(obs),
            reward=float(info.get("reward", 0.0)),
            done=bool(done),
            info=json_safe(info),
            message=message_to_wire(env.format_observation(obs)) if with_message else None,
        )
        return response.done, to_json(response)

    def close(self, session_id: str) -> None:
        """Close and forget the env of `session_id`, if any."""
        env = self.envs.pop(session_id, None)
        if env is not None:
            env.close()

    def format(self, observation: Observation) -> bytes:
        """The `FormatResponse` body for a client's observation; its images are decoded within the limits."""
        try:
            obs = observation_from_wire(observation, **self.image_limits)
        except ImageError as exc:
            raise ServiceError(ErrorCode.INVALID_IMAGE, str(exc)) from None
        if self._formatter is None:  # one env with default options serves every /format
            self._formatter = self.factory.create(self.factory.options_model.model_validate({}), None, None)
        return to_json(FormatResponse(message=message_to_wire(self._formatter.format_observation(obs))))

    def close_all(self) -> None:
        """Close every env (shutdown); a failing close does not stop the others."""
        envs = [*self.envs.values(), *([self._formatter] if self._formatter else [])]
        self.envs.clear()
        self._formatter = None
        for env in envs:
            _close_quietly(env)


def guarded(what: str, fn: Callable[..., T], *args: Any) -> T:
    """Run one env call; a failure other than a `ServiceError` is logged and becomes a 500 naming the call."""
    try:
        return fn(*args)
    except ServiceError:
        raise
    except Exception as exc:
        logger.error("env %s failed", what, exc_info=exc)
        raise ServiceError(
            ErrorCode.INTERNAL, f"environment {what} failed: {type(exc).__name__}: {exc}"
        ) from exc


def _close_quietly(env: Env) -> None:
    """Close an env during shutdown; a failure is logged so that the other envs still get closed."""
    try:
        env.close()
    except Exception:
        logger.exception("closing an env failed")


def task_payload(task: Task) -> list[Any]:
    """A task as plain JSON data `[options, seed, sample]`, for a worker process to validate into the same
    models (`task_from_payload`): no pickle crosses the process boundary."""
    sample = None if task.sample is None else task.sample.model_dump(mode="json", exclude_unset=True)
    return [task.options.model_dump(mode="json", exclude_unset=True), task.seed, sample]


def task_from_payload(
    factory: EnvFactory, options: dict[str, Any], seed: int | None, sample: dict[str, Any] | None
) -> Task:
    """The task that `task_payload` sent, validated again by the env's own models."""
    parsed = factory.options_model.model_validate(options)
    if sample is None:
        return Task(parsed, seed)
    if factory.sample_model is None:
        raise ValueError(f"env {factory.name!r} takes no samples")
    return Task(parsed, seed, factory.sample_model.model_validate(sample))
