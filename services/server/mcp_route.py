"""`/mcp` in the env server's app, built on its first request: a server that no client asks over MCP never
imports the MCP SDK, which is most of `vistarl serve`'s start-up (docs/server.md, "MCP").

The first request imports `mcp_tools` in a worker thread (the event loop keeps answering meanwhile),
builds `EnvTools` and starts its streamable HTTP task group in the task group that `running` holds for
the app's lifespan; every request, the first included, then goes to the SDK's own `/mcp` route.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import anyio
from anyio.abc import TaskGroup, TaskStatus
from starlette.routing import Route, Router
from starlette.types import Receive, Scope, Send

from services.server.embedded import EnvService
from services.server.security import MCP_PATH

if TYPE_CHECKING:
    from services.server.mcp_tools import EnvTools


class LazyMCP:
    """The `/mcp` route of one env service, whose MCP server is built when a request first reaches it."""

    def __init__(self, service: EnvService) -> None:
        self.service = service
        self._tasks: TaskGroup | None = None
        self._router: Router | None = None
        self._building = anyio.Lock()

    def http_routes(self) -> list[Route]:
        """The route at `/mcp`, for the env server's app (run `http_running` around it)."""
        return [Route(MCP_PATH, endpoint=self)]  # an instance, so Starlette treats it as an ASGI app

    @contextlib.asynccontextmanager
    async def http_running(self) -> AsyncIterator[None]:
        """Hold the task group that the MCP endpoint, once built, answers in; for the app's lifespan."""
        async with anyio.create_task_group() as tasks:
            self._tasks = tasks
            try:
                yield
            finally:
                self._tasks = None
                tasks.cancel_scope.cancel()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Hand the request to the SDK's `/mcp` route, building it first if this is the first request."""
        router = self._router or await self._build()
        await router(scope, receive, send)

    async def _build(self) -> Router:
        """Import the SDK, build the tools and start their task group, once however many requests wait."""
        async with self._building:
            if self._router is None:
                if self._tasks is None:
                    raise RuntimeError("/mcp answers only inside the app's lifespan (http_running)")
                module = await anyio.to_thread.run_sync(importlib.import_module, "services.server.mcp_tools")
                tools: EnvTools = module.EnvTools(self.service)
                routes = tools.http_routes()
                await self._tasks.start(_run, tools)
                self._router = Router(routes=routes)
            return self._router


async def _run(tools: EnvTools, *, task_status: TaskStatus[None]) -> None:
    """Keep the tools' streamable HTTP task group open until the lifespan cancels it."""
    async with tools.http_running():
        task_status.started()
        await anyio.sleep_forever()
