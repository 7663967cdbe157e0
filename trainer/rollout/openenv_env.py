"""OpenEnv servers as episode envs: an `openenv+ws://HOST:PORT` env (`openenv+wss://` behind TLS) drives any
OpenEnv server over its WebSocket session protocol (docs/training.md, "OpenEnv envs").

The env URL carries its adapter (`vistarl.trainer.config.OpenEnvAdapter`) as its query. An episode is one
socket, one OpenEnv session: `reset` sends the job's seed and options as the reset's arguments; each
observation becomes a user message (its image fields as PNG data URLs, then its text fields); each reply
becomes the action, in the adapter's `action_field` or as the JSON object it holds. The turn reward is the
env's (none counts 0), and `done` ends the episode as the env's own ending.

The adapter is checked once per server against its `/schema`; an observation without a field it names,
an action schema that needs fields it does not fill, a closed socket and an error answer all fail the
episode (`EnvError`, FAILED) with the env's message. Every wait is bounded: the connection, each answer
and the close by the env timeout (`Envs(timeout_s=...)`). A reply with no valid JSON action is the
model's fault, not the env's: the env is not stepped, and the episode ends with a turn reward of 0.

The messages are `vistarl.clients.protocol`'s OpenEnv models, sent with `websockets`. openenv-core's own
`GenericEnvClient` speaks the same, but importing it imports gradio: seconds of CPU per process
(docs/benchmarks.md, "Start-up"), for a client of some 30 lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx
from jsonschema import Draft202012Validator
from websockets.asyncio.client import ClientConnection, connect

from vistarl.clients.images import decode_image, encode_image
from vistarl.clients.protocol import (
    ImagePart,
    ImageURL,
    Message,
    Observation,
    OpenEnvError,
    OpenEnvMessage,
    OpenEnvReply,
    OpenEnvResult,
    OpenEnvSchema,
    StepResponse,
    TextPart,
)
from vistarl.trainer.config import OpenEnvAdapter
from vistarl.trainer.rollout.episode_env import EnvError, env_errors
from vistarl.trainer.rollout.job import EpisodeJob

__all__ = ["OpenEnvHandle", "OpenEnvServer", "open_server"]

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
"""The largest answer read from an OpenEnv server (its observations carry images)."""
INVALID_ACTION_KEY = "invalid_action"
"""The info key of a turn whose reply held no valid JSON action: why, in a few words."""


@dataclass(frozen=True)
class OpenEnvServer:
    """One OpenEnv server as the adapter meets it: its WebSocket base URL, the adapter, and the validator of
    its action schema (for JSON actions)."""

    url: str
    adapter: OpenEnvAdapter
    action_validator: Draft202012Validator

    def observation(self, fields: Mapping[str, Any]) -> Observation:
        """An OpenEnv observation as vistarl's: its image fields' images, its text fields' text."""
        adapter = self.adapter
        missing = [name for name in (*adapter.image_fields, *adapter.text_fields) if name not in fields]
        if missing:
            raise EnvError(
                f"schema mismatch: the observation has no field {', '.join(missing)} "
                f"(its fields: {', '.join(sorted(fields)) or 'none'})"
            )
        images = [_png_url(name, image) for name in adapter.image_fields for image in _listed(fields[name])]
        return Observation(
            text="\n\n".join(_text(fields[name]) for name in adapter.text_fields), images=images
        )

    def action(self, reply: str) -> dict[str, Any] | str:
        """The action of a reply, or why the reply holds none (JSON actions only)."""
        if not self.adapter.json_action:
            return {self.adapter.action_field: reply}
        action = _last_json_object(reply)
        if action is None:
            return "the reply holds no JSON object"
        errors = sorted(self.action_validator.iter_errors(action), key=str)
        if errors:
            return f"the reply's JSON action does not fit the env's action schema: {errors[0].message}"
        return action


async def open_server(spec: str, timeout_s: float) -> OpenEnvServer:
    """The server an `openenv+ws://` env spec names, its adapter checked against the server's `/schema`
    (fetched within `timeout_s`); `EnvError` when the spec is bad or the adapter does not fit."""
    try:
        url, adapter = OpenEnvAdapter.parse(spec)
    except ValueError as exc:
        raise EnvError(f"bad OpenEnv env {spec!r}: {exc}") from None
    schema_url = url.replace("ws", "http", 1) + "/schema"
    with env_errors("schema"):
        async with httpx.AsyncClient(timeout=timeout_s) as client:
            answer = (await client.get(schema_url)).raise_for_status()
        schemas = OpenEnvSchema.model_validate_json(answer.content)
    observation, action = schemas.observation, schemas.action
    wanted = [*adapter.text_fields, *adapter.image_fields]
    unknown = [name for name in wanted if name not in observation.get("properties", {})]
    if unknown:
        raise EnvError(f"schema mismatch: the env's observation has no field {', '.join(unknown)}")
    if not adapter.json_action:
        required = set(action.get("required", []))
        if adapter.action_field not in action.get("properties", {}) or required - {adapter.action_field}:
            raise EnvError(
                f"schema mismatch: the env's action (fields {sorted(action.get('properties', {}))}, required "
                f"{sorted(required)}) cannot be the reply in {adapter.action_field!r} alone"
            )
    return OpenEnvServer(url, adapter, Draft202012Validator(action))


class OpenEnvHandle:
    """One episode's OpenEnv session: a socket of its own, opened at reset and closed at the end."""

    def __init__(self, server: OpenEnvServer, timeout_s: float) -> None:
        self.server = server
        self.system_prompt = server.adapter.system_prompt
        self.timeout_s = timeout_s
        self._socket: ClientConnection | None = None

    async def reset(self, job: EpisodeJob) -> tuple[dict[str, Any], dict[str, Any]]:
        """Open the socket and reset with the job's seed and options: the first observation's message."""
        if job.task_id is not None or job.sample is not None:
            raise EnvError("an OpenEnv env is reset from a seed and options, not a task_id or a sample")
        arguments = {**job.options, **({} if job.seed is None else {"seed": job.seed})}
        with env_errors("reset"):
            self._socket = await connect(
                f"{self.server.url}/ws",
                open_timeout=self.timeout_s,
                close_timeout=self.timeout_s,
                max_size=MAX_MESSAGE_BYTES,
            )
            first = await self._ask("reset", arguments)
        return _message(self.server.observation(first.observation)), {}

    async def step(self, text: str) -> tuple[dict[str, Any], StepResponse]:
        """Send the reply as the action: the next observation's message and the turn (reward, done)."""
        if self._socket is None:
            raise EnvError("step before reset")
        action = self.server.action(text)
        if isinstance(action, str):
            ended = Observation()
            turn = StepResponse(observation=ended, reward=0.0, done=True, info={INVALID_ACTION_KEY: action})
            return _message(ended), turn
        with env_errors("step"):
            result = await self._ask("step", action)
        observation = self.server.observation(result.observation)
        reward = 0.0 if result.reward is None else result.reward
        return _message(observation), StepResponse(observation=observation, reward=reward, done=result.done)

    async def close(self) -> None:
        """Say `close`, then let the server close the socket once it has ended the session (or close it
        after the env timeout); safe to call twice, never raises."""
        socket, self._socket = self._socket, None
        if socket is None:
            return
        with contextlib.suppress(Exception):  # a socket the env closed is closed already
            await socket.send(OpenEnvMessage(type="close").model_dump_json(exclude_defaults=True))
            async with asyncio.timeout(self.timeout_s):
                await socket.wait_closed()
        with contextlib.suppress(Exception):
            await socket.close()

    async def _ask(self, kind: str, data: Mapping[str, Any]) -> OpenEnvResult:
        """Send one message and wait (at most the env timeout) for its observation; `EnvError` carrying the
        env's own message for an error answer."""
        assert self._socket is not None
        await self._socket.send(
            OpenEnvMessage(type=kind, data=dict(data)).model_dump_json(exclude_defaults=True)
        )
        async with asyncio.timeout(self.timeout_s):
            reply = OpenEnvReply.model_validate_json(await self._socket.recv())
        if reply.type == "error":
            error = OpenEnvError.model_validate(reply.data)
            raise EnvError(f"the env answered {kind} with {error.code}: {error.message}")
        if reply.type != "observation":
            raise EnvError(f"the env answered {kind} with a {reply.type} answer, not an observation")
        return OpenEnvResult.model_validate(reply.data)


def _listed(value: Any) -> list[Any]:
    """A field's images: its list, or the one it holds (none for null)."""
    if value is None:
        return []
    return list(value) if isinstance(value, list) else [value]


def _png_url(field: str, image: Any) -> str:
    """An image field's value (base64 or a data URL) as a PNG data URL, decoded within the image limits."""
    try:
        return encode_image(decode_image(image))
    except ValueError as exc:
        raise EnvError(f"observation field {field!r}: {exc}") from None


def _text(value: Any) -> str:
    """A text field's value: itself if a string, else its JSON."""
    return value if isinstance(value, str) else json.dumps(value)


def _message(observation: Observation) -> dict[str, Any]:
    """The user message of an observation: its images, then its text (when it has any)."""
    parts: list[ImagePart | TextPart] = [ImagePart(image_url=ImageURL(url=url)) for url in observation.images]
    if observation.text:
        parts.append(TextPart(text=observation.text))
    return Message(role="user", content=parts).model_dump(mode="json")


def _last_json_object(reply: str) -> dict[str, Any] | None:
    """The last JSON object in a reply (the whole reply, or one inside text or a code fence), or None."""
    decoder, found = json.JSONDecoder(), None
    start = reply.find("{")
    while start != -1:
        try:
            found, end = decoder.raw_decode(reply, start)
        except json.JSONDecodeError:
            end = start + 1
        start = reply.find("{", end)
    return found
