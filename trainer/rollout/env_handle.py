"""One interface to an episode's environment (`EpisodeEnv`), wherever and whatever it runs.

An env is named by an `http(s)://` URL (an env server, reached through a shared `AsyncEnvClient`) or by a
registered name or import path (`sokoban`, `vistarl.services.sokoban`: the same server code, run in this
process by `vistarl.services.sessions_api.open_in_process`). Either way an episode speaks the wire protocol's
models through one contract, `vistarl.services.sessions_api.EnvSessions`: a job's task becomes a
`ResetRequest` (seed, task id, sample, options), each reply a `StepRequest` with a request id, and the answers
carry the env's own chat messages (image parts as PNG data URLs). So the episode loop cannot tell the two
apart, and a task reaches the env the same way in process, over HTTP and through the queue. An `openenv+ws://`
URL names an OpenEnv server instead, played by `vistarl.trainer.rollout.openenv_env.OpenEnvHandle`.
Every env failure (an exception, a timeout, an unreachable or failing server) surfaces as `EnvError`
(`vistarl.trainer.rollout.episode_env`, the contract both handles meet).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import TYPE_CHECKING, Any

from vistarl.clients.http import AsyncEnvClient, RetryPolicy
from vistarl.clients.protocol import (
    InfoResponse,
    Message,
    ResetRequest,
    ResetResponse,
    StepRequest,
    StepResponse,
)
from vistarl.services.sessions_api import EnvSessions, InProcessSessions, open_in_process
from vistarl.trainer.config import is_openenv
from vistarl.trainer.rollout.episode_env import EnvError, EpisodeEnv, env_errors
from vistarl.trainer.rollout.job import EpisodeJob

if TYPE_CHECKING:
    from vistarl.trainer.rollout.openenv_env import OpenEnvServer

__all__ = ["EnvHandle", "Envs", "describe_env", "is_openenv", "is_url", "split_size"]

log = logging.getLogger(__name__)


def is_url(spec: str) -> bool:
    """Whether an env spec names a remote server rather than an env module."""
    return spec.startswith(("http://", "https://")) or is_openenv(spec)


class RemoteSessions:
    """An env server's sessions, through a client shared by every episode on it; `/info` fetched once."""

    def __init__(self, client: AsyncEnvClient) -> None:
        self.client = client
        self._info: InfoResponse | None = None

    async def describe(self) -> InfoResponse:
        if self._info is None:
            self._info = await self.client.info()
        return self._info

    async def reset(self, request: ResetRequest) -> ResetResponse:
        return await self.client.reset(
            seed=request.seed,
            task_id=request.task_id,
            sample=request.sample,
            options=request.options,
            format=request.format,
        )

    async def step(self, request: StepRequest) -> StepResponse:
        return await self.client.step(
            request.session_id, request.action, request_id=request.request_id, format=request.format
        )

    async def close(self, session_id: str) -> bool:
        return await self.client.close(session_id)


class Envs:
    """The envs one process plays: a shared client per env server URL, in-process sessions per env module,
    and each OpenEnv server's adapter, checked once against its schema (a socket per episode).

    `timeout_s` bounds one env call (an attempt, for a server); `outage_s` how long a call to an env
    server keeps retrying through an outage (connection refused, 503) before the episode fails.
    """

    def __init__(self, *, token: str | None = None, timeout_s: float = 60.0, outage_s: float = 60.0) -> None:
        self.token = token
        self.timeout_s = timeout_s
        self.retry = RetryPolicy.outage(outage_s, base_delay=0.2)
        self._remote: dict[str, RemoteSessions] = {}
        self._local: dict[str, InProcessSessions] = {}
        self._openenv: dict[str, OpenEnvServer] = {}
        self._starting = asyncio.Lock()

    async def open(self, spec: str) -> EpisodeEnv:
        """A handle for one episode of the env `spec` names (a URL, a registered name or an import path)."""
        if not is_openenv(spec):
            return EnvHandle(await self.sessions(spec))
        from vistarl.trainer.rollout.openenv_env import (  # openenv-core, on first use
            OpenEnvHandle,
            open_server,
        )

        async with self._starting:
            if spec not in self._openenv:
                self._openenv[spec] = await open_server(spec, self.timeout_s)
        return OpenEnvHandle(self._openenv[spec], self.timeout_s)

    async def sessions(self, spec: str) -> EnvSessions:
        """The sessions of the vistarl env `spec` names: an env server's, or this process's."""
        if is_openenv(spec):
            raise EnvError(f"{spec} is an OpenEnv server, whose sessions are its sockets")
        if is_url(spec):
            return self._remote_sessions(spec.rstrip("/"))
        async with self._starting:
            if spec not in self._local:
                try:
                    self._local[spec] = await open_in_process(spec, self.timeout_s)
                except ValueError as exc:
                    raise EnvError(str(exc)) from exc
        return self._local[spec]

    def _remote_sessions(self, url: str) -> RemoteSessions:
        if url not in self._remote:
            client = AsyncEnvClient(url, token=self.token, timeout=self.timeout_s, retry=self.retry)
            self._remote[url] = RemoteSessions(client)
        return self._remote[url]

    async def aclose(self) -> None:
        """Close every client's connections and stop every env's in-process sessions."""
        remote, local = list(self._remote.values()), list(self._local.values())
        self._remote, self._local = {}, {}
        await asyncio.gather(
            *(sessions.client.shutdown() for sessions in remote),
            *(sessions.stop() for sessions in local),
        )


async def describe_env(spec: str) -> InfoResponse:
    """The `/info` of the env `spec` names (its tasks, limits, prompts), from the server or in process."""
    envs = Envs()
    try:
        return await (await envs.sessions(spec)).describe()
    finally:
        await envs.aclose()


async def split_size(spec: str, split: str, key: str) -> int:
    """How many tasks the env `spec` names holds in `split`; a ValueError naming the config `key` when it
    holds no such split, or an empty one."""
    sizes = {info.name: info.size for info in (await describe_env(spec)).datasets.splits}
    if not sizes.get(split):
        raise ValueError(f"{key} {split!r}: the env holds no tasks there (its splits: {sizes})")
    return sizes[split]


class EnvHandle:
    """One episode's session on an env. `system_prompt` is valid once `reset` has returned."""

    def __init__(self, sessions: EnvSessions) -> None:
        self.sessions = sessions
        self.system_prompt = ""
        self.session_id: str | None = None

    async def reset(self, job: EpisodeJob) -> tuple[dict[str, Any], dict[str, Any]]:
        """Start the job's task: the first observation as a user message, and the env's info."""
        request = ResetRequest(
            seed=job.seed, task_id=job.task_id, sample=job.sample, options=job.options, format=True
        )
        with env_errors("reset"):
            self.system_prompt = (await self.sessions.describe()).system_prompt
            first = await self.sessions.reset(request)
        self.session_id = first.session_id
        return _required_message(first.message, "reset"), first.info

    async def step(self, text: str) -> tuple[dict[str, Any], StepResponse]:
        """Send the model's response: the next observation's message (as the tokenizer takes it) and the
        answer itself (turn reward, `done`, `truncated`, info).

        The request id makes a retried step (after a lost answer) safe: the env steps once.
        """
        if self.session_id is None:
            raise EnvError("step before reset")
        request = StepRequest(
            session_id=self.session_id, action=text, request_id=uuid.uuid4().hex, format=True
        )
        with env_errors("step"):
            result = await self.sessions.step(request)
        return _required_message(result.message, "step"), result

    async def close(self) -> None:
        """End the session; a failure (e.g. a dead server) is logged, never raised; safe to call twice."""
        session_id, self.session_id = self.session_id, None
        if session_id is None:
            return
        try:
            with env_errors("close"):
                await self.sessions.close(session_id)
        except EnvError as exc:
            log.warning("could not close session %s: %s", session_id, exc)


def _required_message(message: Message | None, what: str) -> dict[str, Any]:
    """The formatted message a `format=True` call must return, as the plain dict the tokenizer takes."""
    if message is None:
        raise EnvError(f"env answered {what} without the formatted message")
    return message.model_dump(mode="json")
