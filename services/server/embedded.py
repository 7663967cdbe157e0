"""`EnvService`: one env's sessions, tasks and env pool, as a server holds them, with or without HTTP.

`create_app` puts HTTP in front of an `EnvService`. In process, it answers `vistarl.services.sessions_api`'s
`EnvSessions` contract (`open_in_process` starts one), so an in-process episode goes through the server's
own rules (tasks at reset, options, limits, idempotent steps, timeouts) rather than a second copy of
them, and gets the typed answers the env's thread made, with no JSON in between.
"""

from __future__ import annotations

import asyncio
import contextlib

from vistarl.clients.protocol import (
    ErrorCode,
    InfoResponse,
    ResetRequest,
    ResetResponse,
    StepRequest,
    StepResponse,
)
from vistarl.httpserver.errors import ServiceError
from vistarl.services.env_api import EnvFactory
from vistarl.services.server.env_pool import create_pool
from vistarl.services.server.metrics import ServerMetrics
from vistarl.services.server.sessions import SessionManager
from vistarl.services.server.settings import ServerSettings
from vistarl.services.server.tasks import TaskCatalog

__all__ = ["EnvService"]


class EnvService:
    """The parts of an env server below HTTP. `start()` before use, `stop()` after; `manager` answers
    every env call as the HTTP route sends it, the methods below as an in-process caller takes it."""

    def __init__(self, factory: EnvFactory, settings: ServerSettings | None = None) -> None:
        self.factory = factory
        self.settings = settings or ServerSettings()
        self.metrics = ServerMetrics()
        self.tasks = TaskCatalog.build(factory, self.settings)
        self.pool = create_pool(factory, self.settings, self.metrics)
        self.manager = SessionManager(factory, self.settings, self.metrics, self.pool, self.tasks)
        self.info = InfoResponse(
            name=factory.name,
            version=factory.version,
            description=factory.description,
            system_prompt=factory.system_prompt,
            action_format=factory.action_format,
            config_schema=factory.config_schema(),
            limits=self.settings.limits(),
            datasets=self.tasks.datasets(),
            tools=factory.tools,
        )
        self._reaper: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Check the session store, open the env pool and start the idle-session reaper."""
        await self.manager.open()
        self._reaper = asyncio.create_task(self.manager.run_reaper(), name="vistarl-session-reaper")

    async def stop(self) -> None:
        """Stop the reaper, then drain: refuse new episodes and close every env."""
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        await self.manager.shutdown()

    async def describe(self) -> InfoResponse:
        """`GET /info` without the HTTP."""
        return self.info

    async def reset(self, request: ResetRequest) -> ResetResponse:
        """`POST /reset` without the HTTP: the same validation, task lookup and limits."""
        return (await self.manager.reset(request)).typed(ResetResponse)

    async def step(self, request: StepRequest) -> StepResponse:
        """`POST /step` without the HTTP."""
        return (await self.manager.step(request)).typed(StepResponse)

    async def close(self, session_id: str) -> bool:
        """`DELETE /sessions/{id}` without the HTTP: True if the session ended now, False if it was
        already gone."""
        try:
            await self.manager.close(session_id)
        except ServiceError as exc:
            if exc.code != ErrorCode.SESSION_NOT_FOUND:
                raise
            return False
        return True
