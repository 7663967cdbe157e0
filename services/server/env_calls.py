"""What an env call does, from arguments to the JSON body the client gets: the work both env pools run.

`EnvHost` keeps the live envs of the sessions it hosts, by session id, and answers `start`, `step`,
`restore`, `close` and `format` with ready-to-send JSON bytes (a `Reply` for `start` and `step`, which
keeps the response too, for callers in the same process): observations are encoded (PNG data URLs,
plain-JSON info) where the env ran, in the server's threads or in an env worker process, never on the
event loop. For a shared session store it also exports each env's state after a reset and every step, as
msgpack (`encode_state`), and rebuilds envs from such states (`EnvFactory.restore`).
The session rules (capacity, ordering, retries, expiry) are `vistarl.services.server.sessions`' business, not
this.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, TypeVar

import msgpack
from pydantic import BaseModel
from pydantic_core import to_json

from vistarl.clients.images import ImageError
from vistarl.clients.protocol import ErrorCode, FormatResponse, Observation, ResetResponse, StepResponse
from vistarl.httpserver.errors import ServiceError
from vistarl.services.env_api import Env, EnvFactory, checked_step
from vistarl.services.server.encoding import (
    answer_to_wire,
    json_safe,
    message_to_wire,
    observation_from_wire,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R", bound=BaseModel)


@dataclass(frozen=True)
class Task:
    """What a new episode starts from: validated options, and a seed or a validated sample (or neither)."""

    options: BaseModel
    seed: int | None = None
    sample: BaseModel | None = None


@dataclass(frozen=True)
class Reply(Generic[R]):
    """An env call's answer: the JSON body that HTTP sends, and the response it encodes when that was made
    in this process (an env worker's answer, or a stored one replayed, comes as the body alone)."""

    body: bytes
    response: R | None = None

    def typed(self, model: type[R]) -> R:
        """The response: the one made here, else parsed from the body."""
        return self.response if self.response is not None else model.model_validate_json(self.body)


class Stepped(NamedTuple):
    """One step's outcome: whether the episode is done, the `StepResponse`, and the env's state after it
    (msgpack, when the host exports states)."""

    done: bool
    reply: Reply[StepResponse]
    state: bytes | None


class EnvGoneError(ServiceError):
    """A 500 after which the session's env cannot be used again: the caller forgets it here."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.INTERNAL, message)


class EnvLostError(EnvGoneError):
    """The env was gone before the call was sent (its worker had died), so the call did nothing."""


class EnvHost:
    """The envs of one pool (or one worker process), and the calls on them.

    Each method runs synchronously; the caller makes sure one session sees one call at a time.
    `export_state` makes `start` and `step` return each env's state too, for a shared session store.
    """

    def __init__(
        self, factory: EnvFactory, max_image_bytes: int, max_image_pixels: int, export_state: bool = False
    ) -> None:
        self.factory = factory
        self.image_limits = {"max_bytes": max_image_bytes, "max_pixels": max_image_pixels}
        self.export_state = export_state
        self.envs: dict[str, Env] = {}
        self._formatter: Env | None = None

    def start(
        self, session_id: str, task: Task, with_message: bool
    ) -> tuple[Reply[ResetResponse], bytes | None]:
        """Build and reset an env for `session_id` from its task; the `ResetResponse` and the state.

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
            observation, message = answer_to_wire(obs, env.format_observation(obs) if with_message else None)
            response = ResetResponse(
                session_id=session_id, observation=observation, info=json_safe(info), message=message
            )
            reply = Reply(to_json(response), response)
            state = self._state(env)
        except BaseException:
            env.close()
            raise
        self.envs[session_id] = env
        return reply, state

    def step(self, session_id: str, action: str, with_message: bool) -> Stepped:
        """One env step: done, the `StepResponse` (from the env's `StepResult`), the state.

        A step that ends the episode also closes and forgets the env (its session frees its slot at once),
        so the end of an episode costs no call of its own."""
        env = self.envs[session_id]
        result = checked_step(env, action)
        formatted = env.format_observation(result.observation) if with_message else None
        observation, message = answer_to_wire(result.observation, formatted)
        response = StepResponse(
            observation=observation,
            reward=result.reward,
            done=result.done,
            truncated=result.truncated,
            info=json_safe(result.info),
            message=message,
        )
        stepped = Stepped(response.done, Reply(to_json(response), response), self._state(env))
        if stepped.done:
            del self.envs[session_id]
            _close_quietly(env)
        return stepped

    def restore(self, session_id: str, state: bytes) -> None:
        """Rebuild the env of `session_id` from what `encode_state` wrote, replacing any env it had here."""
        env = self.factory.restore(decode_state(state))
        stale = self.envs.get(session_id)
        self.envs[session_id] = env
        if stale is not None:
            _close_quietly(stale)

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

    def _state(self, env: Env) -> bytes | None:
        """The env's state to store, when this host exports states."""
        return encode_state(env) if self.export_state else None

    def close_all(self) -> None:
        """Close every env (shutdown); a failing close does not stop the others."""
        envs = [*self.envs.values(), *([self._formatter] if self._formatter else [])]
        self.envs.clear()
        self._formatter = None
        for env in envs:
            _close_quietly(env)


def encode_state(env: Env) -> bytes:
    """`env.state()` as msgpack, the form a shared session store keeps; data that is not JSON-safe is a
    TypeError naming it (no pickle)."""
    return bytes(msgpack.packb(env.state()))


def decode_state(state: bytes) -> dict[str, Any]:
    """The state that `encode_state` wrote, as `EnvFactory.restore` takes it."""
    decoded: dict[str, Any] = msgpack.unpackb(state)
    return decoded


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
    """Close an env that is being replaced or shut down; a failure is logged, not raised."""
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
