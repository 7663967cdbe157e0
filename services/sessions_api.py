"""The sessions contract: what one env's sessions answer wherever they run, and how to run them here.

`EnvSessions` is what an episode calls: `describe` (the env's `/info`), `reset`, `step` and `close`, in
the wire protocol's models (`vistarl.clients.protocol`). An env server answers it over HTTP, through
`vistarl.clients.http.AsyncEnvClient`; `open_in_process` answers it in this process with the env server's own
service below HTTP (`vistarl.services.server.embedded.EnvService`), so that an in-process episode follows the
server's rules without a copy of them. A caller of this module needs nothing of the server's internals.
"""

from __future__ import annotations

from typing import Protocol

from vistarl.clients.protocol import InfoResponse, ResetRequest, ResetResponse, StepRequest, StepResponse
from vistarl.services.env_api import load_env_factory
from vistarl.services.server.embedded import EnvService
from vistarl.services.server.settings import ServerSettings

__all__ = ["EnvSessions", "InProcessSessions", "open_in_process"]


class EnvSessions(Protocol):
    """One env's sessions: an env server's, or those of this process. Failures raise: a bad request, an
    unknown session or a failing env as the server's errors, with its error code and message."""

    async def describe(self) -> InfoResponse:
        """The env's `/info`: its system prompt, action format, tasks and limits."""
        ...

    async def reset(self, request: ResetRequest) -> ResetResponse:
        """Start a session."""
        ...

    async def step(self, request: StepRequest) -> StepResponse:
        """Step a session."""
        ...

    async def close(self, session_id: str) -> bool:
        """End a session: True if it ended now, False if it was already gone."""
        ...


class InProcessSessions(EnvSessions, Protocol):
    """An env's sessions in this process, which its owner stops."""

    async def stop(self) -> None:
        """Refuse new episodes and close every env."""
        ...


async def open_in_process(spec: str, timeout_s: float) -> InProcessSessions:
    """The sessions of the env `spec` names (a registered name or an import path), run in this process
    with the env server's rules and defaults (`VISTARL_*` settings included), the envs in threads, each
    env call bounded by `timeout_s`. A ValueError names an unknown env or a bad setting."""
    service = EnvService(load_env_factory(spec), ServerSettings(env_workers=0, env_timeout_s=timeout_s))
    await service.start()
    return service
