"""One interface to an episode's environment, whether it runs in this process or behind an env server.

`open_env(spec)` returns an `EnvHandle`: a `LocalEnvHandle` for a registered name or import path
(`sokoban`, `services.sokoban`), a `RemoteEnvHandle` for an `http(s)://` URL. Both speak in the
same OpenAI-style user messages (image parts as PNG data URLs, then the text), produced by the
env's own `format_observation`, so the episode loop cannot tell them apart. Every env failure
(an exception, a timeout, an unreachable or failing server) surfaces as `EnvError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol, TypeVar

import anyio
import anyio.to_thread

from clients.errors import EnvClientError
from clients.http import AsyncEnvClient, RetryPolicy
from clients.protocol import Message
from services.env_api import ENV_MODULES, Env, EnvFactory, EnvObservation, load_env_factory
from services.server.encoding import json_safe, message_to_wire
from trainer.rollout.job import EpisodeJob

__all__ = [
    "EnvError",
    "EnvHandle",
    "LocalEnvHandle",
    "RemoteEnvHandle",
    "RemoteEnvs",
    "is_url",
    "open_env",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_ENV_TIMEOUT_S = 60.0


class EnvError(RuntimeError):
    """The environment failed: it raised, overran its timeout, or its server failed or is unreachable."""


class EnvHandle(Protocol):
    """One episode's environment. `system_prompt` is valid once `reset` has returned."""

    system_prompt: str

    async def reset(self, job: EpisodeJob) -> tuple[dict[str, Any], dict[str, Any]]:
        """Start the job's episode: the first observation as a user message, and the env's info."""
        ...

    async def step(self, text: str) -> tuple[dict[str, Any], float, bool, dict[str, Any]]:
        """Send the model's response: the next observation's message, turn reward, done, info."""
        ...

    async def close(self) -> None:
        """End the episode and free its resources; never raises, safe to call twice."""
        ...


def is_url(spec: str) -> bool:
    """Whether an env spec names a remote server rather than an env module."""
    return spec.startswith(("http://", "https://"))


def message_dict(message: Message) -> dict[str, Any]:
    """A wire message as the plain dict the tokenizer's chat template and the trajectory take."""
    return message.model_dump(mode="json")


@contextlib.contextmanager
def _env_errors(what: str) -> Iterator[None]:
    """Re-raise any failure of an env call (but not cancellation) as `EnvError` naming the call."""
    try:
        yield
    except EnvError:
        raise
    except TimeoutError as exc:
        raise EnvError(f"env {what} timed out") from exc
    except Exception as exc:
        raise EnvError(f"env {what} failed: {type(exc).__name__}: {exc}") from exc


class LocalEnvHandle:
    """Runs an env package's hooks in a worker thread, encoding images as servers do."""

    def __init__(self, module: str, *, timeout_s: float = DEFAULT_ENV_TIMEOUT_S) -> None:
        self.factory: EnvFactory = load_env_factory(module)
        package = importlib.import_module(ENV_MODULES.get(module, module))
        self._build_env: Callable[..., Env] | None = getattr(package, "build_env", None)
        self.system_prompt = self.factory.system_prompt
        self.timeout_s = timeout_s
        self._env: Env | None = None

    async def reset(self, job: EpisodeJob) -> tuple[dict[str, Any], dict[str, Any]]:
        """Build an env from the job's options and seed (or a dataset `sample` via `build_env`); reset it."""
        with _env_errors("reset"):
            env = await self._in_thread(self._create, job.seed, dict(job.options), job.sample)
            self._env = env
            return await self._in_thread(_reset_and_format, env)

    async def step(self, text: str) -> tuple[dict[str, Any], float, bool, dict[str, Any]]:
        """Step the env with the response text, in a worker thread."""
        if self._env is None:
            raise EnvError("step before reset")
        with _env_errors("step"):
            return await self._in_thread(_step_and_format, self._env, text)

    async def close(self) -> None:
        """Close the env in a worker thread; a failing close is logged."""
        env, self._env = self._env, None
        if env is None:
            return
        try:
            with _env_errors("close"):
                await self._in_thread(env.close)
        except EnvError as exc:
            log.warning("%s", exc)

    def _create(self, seed: int | None, options: dict[str, Any], sample: Mapping[str, Any] | None) -> Env:
        """A fresh env: the server's constructor, or the package's `build_env` hook for a dataset sample."""
        if sample is None:
            return self.factory.create(self.factory.options_model.model_validate(options), seed, None)
        if self._build_env is None:
            raise EnvError(f"env {self.factory.name!r} has no build_env hook to take a dataset sample")
        return self._build_env(sample=sample, **options)

    async def _in_thread(self, fn: Callable[..., T], *args: Any) -> T:
        """Run blocking env code off the event loop; give up waiting after `timeout_s`."""
        with anyio.fail_after(self.timeout_s):
            return await anyio.to_thread.run_sync(fn, *args, abandon_on_cancel=True)


def _format(env: Env, obs: EnvObservation) -> dict[str, Any]:
    """The env's own message for an observation, with PIL images encoded as data URLs."""
    return message_dict(message_to_wire(env.format_observation(obs)))


def _reset_and_format(env: Env) -> tuple[dict[str, Any], dict[str, Any]]:
    obs, info = env.reset()
    return _format(env, obs), json_safe(info)


def _step_and_format(env: Env, text: str) -> tuple[dict[str, Any], float, bool, dict[str, Any]]:
    obs, done, info = env.step(text)
    return _format(env, obs), float(info.get("reward", 0.0)), bool(done), json_safe(info)


class RemoteEnvs:
    """The env servers one process talks to: one shared `AsyncEnvClient` and cached `/info` per URL."""

    def __init__(
        self, *, token: str | None = None, timeout_s: float = 30.0, retry: RetryPolicy | None = None
    ) -> None:
        self.token = token
        self.timeout_s = timeout_s
        self.retry = retry
        self._clients: dict[str, AsyncEnvClient] = {}
        self._prompts: dict[str, str] = {}

    def client(self, url: str) -> AsyncEnvClient:
        """The shared client of `url`, created on first use."""
        url = url.rstrip("/")
        if url not in self._clients:
            self._clients[url] = AsyncEnvClient(
                url, token=self.token, timeout=self.timeout_s, retry=self.retry
            )
        return self._clients[url]

    async def system_prompt(self, url: str) -> str:
        """The server's system prompt from `/info`, fetched once per URL."""
        url = url.rstrip("/")
        if url not in self._prompts:
            self._prompts[url] = (await self.client(url).info()).system_prompt
        return self._prompts[url]

    async def aclose(self) -> None:
        """Close every client's connection pool."""
        clients, self._clients = list(self._clients.values()), {}
        await asyncio.gather(*(client.shutdown() for client in clients))


class RemoteEnvHandle:
    """An episode on an env server, through a shared client; the session is deleted by `close()`."""

    def __init__(self, url: str, remotes: RemoteEnvs) -> None:
        self.url = url
        self.remotes = remotes
        self.client = remotes.client(url)
        self.system_prompt = ""
        self.session_id: str | None = None

    async def reset(self, job: EpisodeJob) -> tuple[dict[str, Any], dict[str, Any]]:
        """Fetch the system prompt (once per server) and `POST /reset` with `format=True`."""
        if job.sample is not None:
            raise EnvError("an env server takes options, not a dataset sample: pass the sample's env config")
        with _env_errors("reset"):
            self.system_prompt = await self.remotes.system_prompt(self.url)
            first = await self.client.reset(seed=job.seed, options=job.options, format=True)
        self.session_id = first.session_id
        return _required_message(first.message, "reset"), first.info

    async def step(self, text: str) -> tuple[dict[str, Any], float, bool, dict[str, Any]]:
        """`POST /step` with `format=True`; safe to retry, since the client sends a request id."""
        if self.session_id is None:
            raise EnvError("step before reset")
        with _env_errors("step"):
            result = await self.client.step(self.session_id, text, format=True)
        return _required_message(result.message, "step"), result.reward, result.done, result.info

    async def close(self) -> None:
        """Delete the session; a failure (e.g. a dead server) is logged, not raised."""
        session_id, self.session_id = self.session_id, None
        if session_id is None:
            return
        try:
            await self.client.close(session_id)
        except EnvClientError as exc:
            log.warning("could not close session %s on %s: %s", session_id, self.url, exc)


def _required_message(message: Message | None, what: str) -> dict[str, Any]:
    """The formatted message a `format=True` call must return."""
    if message is None:
        raise EnvError(f"env server answered {what} without the formatted message")
    return message_dict(message)


def open_env(
    spec: str, remotes: RemoteEnvs | None = None, *, timeout_s: float = DEFAULT_ENV_TIMEOUT_S
) -> EnvHandle:
    """A handle for one episode: remote (through `remotes`' shared client) for a URL, else in-process."""
    if is_url(spec):
        if remotes is None:
            raise ValueError(
                f"env {spec!r} is a server URL; pass the RemoteEnvs whose client should reach it"
            )
        return RemoteEnvHandle(spec, remotes)
    try:
        return LocalEnvHandle(spec, timeout_s=timeout_s)
    except ValueError as exc:
        raise EnvError(str(exc)) from exc
