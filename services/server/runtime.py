"""One env's sessions without a transport: the session manager with its env pool, tasks and metrics, and
the context that runs them. The HTTP app (`services.server.app`) and the stdio MCP server
(`services.server.mcp_tools`) each serve one, so both keep the same session rules.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from services.env_api import EnvFactory
from services.server.env_pool import create_pool
from services.server.metrics import ServerMetrics
from services.server.sessions import SessionManager
from services.server.settings import ServerSettings
from services.server.tasks import TaskCatalog


@dataclass(frozen=True)
class EnvRuntime:
    """The parts that hold one env's sessions, built from its factory and the server settings."""

    factory: EnvFactory
    settings: ServerSettings
    metrics: ServerMetrics
    tasks: TaskCatalog
    manager: SessionManager

    @classmethod
    def build(cls, factory: EnvFactory, settings: ServerSettings) -> EnvRuntime:
        """Metrics, tasks, the env pool `settings` asks for, and the session manager over them."""
        metrics = ServerMetrics()
        tasks = TaskCatalog.build(factory, settings)
        pool = create_pool(factory, settings, metrics)
        return cls(factory, settings, metrics, tasks, SessionManager(factory, settings, metrics, pool, tasks))

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Start the env pool and the idle reaper; on exit drain, stop the reaper and close every env."""
        await self.manager.pool.open()
        reaper = asyncio.create_task(self.manager.run_reaper(), name="vistarl-session-reaper")
        try:
            yield
        finally:
            reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reaper
            await self.manager.shutdown()
