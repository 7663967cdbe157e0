"""`/mcp` in the env server's app, built on its first request: a server that no client asks over MCP never
imports the MCP SDK, which is most of `vistarl serve`'s start-up (docs/server.md, "MCP").

The first request imports `mcp_tools` in a worker thread (the event loop keeps answering meanwhile),
builds `EnvTools` and starts its streamable HTTP task group in the task group that `running` holds for
the app's lifespan; every request, the first included, then goes to the SDK's own `/mcp` route.

The route answers GET itself with 405 (the stateless transport has no server-initiated messages to
stream), and gives the SDK's plain-text refusals (421, 403) the `ErrorResponse` body of every other error.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import anyio
from anyio.abc import TaskGroup, TaskStatus
from starlette.routing import Route, Router
from starlette.types import Message, Receive, Scope, Send

from vistarl.clients.protocol import ErrorCode
from vistarl.services.server.embedded import EnvService
from vistarl.services.server.security import MCP_PATH
from vistarl.serving.guard import refusal_of
from vistarl.serving.metrics import ServingMetrics

if TYPE_CHECKING:
    from vistarl.services.server.mcp_tools import EnvTools

NO_MCP_STREAM = (
    "GET /mcp: this server sends no server-initiated messages, so it opens no SSE stream; "
    "POST each JSON-RPC request (MCP's streamable HTTP allows 405 here)"
)
PLAIN_REFUSALS = {403: ErrorCode.FORBIDDEN, 421: ErrorCode.MISDIRECTED}
"""The statuses of the MCP SDK's plain-text refusals (its DNS-rebinding guard: a foreign `Origin`, a
foreign `Host`), answered as `ErrorResponse` bodies with these codes."""
LOOPBACK_HINT = "a server bound to a loopback address answers /mcp only for loopback Host and Origin headers"


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
        """Refuse GET; hand any other request to the SDK's `/mcp` route, building it first if this is the
        first request."""
        metrics = self.service.metrics
        if scope["method"] == "GET":
            refusal = refusal_of(metrics, ErrorCode.BAD_REQUEST, NO_MCP_STREAM, {"Allow": "POST"}, status=405)
            await refusal(scope, receive, send)
            return
        router = self._router or await self._build()
        await router(scope, receive, json_refusals(send, metrics))

    async def _build(self) -> Router:
        """Import the SDK, build the tools and start their task group, once however many requests wait."""
        async with self._building:
            if self._router is None:
                if self._tasks is None:
                    raise RuntimeError("/mcp answers only inside the app's lifespan (http_running)")
                module = await anyio.to_thread.run_sync(
                    importlib.import_module, "vistarl.services.server.mcp_tools"
                )
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


def json_refusals(send: Send, metrics: ServingMetrics) -> Send:
    """`send`, with a plain-text answer of a `PLAIN_REFUSALS` status (the MCP SDK's) sent instead as an
    `ErrorResponse` body carrying its text."""
    refused: list[Message] = []

    async def json_send(message: Message) -> None:
        if message["type"] == "http.response.start" and message["status"] in PLAIN_REFUSALS:
            media_type = dict(message.get("headers", [])).get(b"content-type", b"")
            if not media_type.startswith(b"application/json"):
                refused.append(message)
                return
        if not refused:
            await send(message)
            return
        refused.append(message)
        if message.get("more_body", False):
            return
        text = b"".join(part.get("body", b"") for part in refused[1:]).decode(errors="replace").strip()
        status = refused[0]["status"]
        answer = refusal_of(metrics, PLAIN_REFUSALS[status], f"{text}: {LOOPBACK_HINT}", status=status)
        await send({"type": "http.response.start", "status": status, "headers": answer.raw_headers})
        await send({"type": "http.response.body", "body": answer.body})

    return json_send
