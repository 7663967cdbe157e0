"""`/mcp` in the env server's app, built on its first request: a server that no client asks over MCP never
imports the MCP SDK, which is most of `vistarl serve`'s start-up (docs/server.md, "MCP").

The first request imports `mcp_tools` in a worker thread (the event loop keeps answering meanwhile),
builds `EnvTools` and starts its streamable HTTP task group in the task group that `running` holds for
the app's lifespan; every request, the first included, then goes to the SDK's own `/mcp` route.

The route answers GET itself with 405 (the stateless transport has no server-initiated messages to
stream), and gives the SDK's plain-text refusals (421, 403) the `ErrorResponse` body of every other error.

It checks the bearer token itself (the request guard lets `/mcp` through, `security.ROUTE_GUARDED_PATHS`),
after reading the body: a body that is no JSON-RPC message gets the JSON-RPC error OpenEnv's server
answers (200, `{"jsonrpc": "2.0", "id": null, "error": ...}`) with the token or without it, which is what
`openenv validate` asks of `POST /mcp {}`; every message, whatever its method, needs the token (401
otherwise). So without the token a client learns only that the body was not JSON-RPC, never a tool, a
session or the env's prompt. Without the token the body is read up to `UNAUTHENTICATED_BODY_BYTES`, and
a longer one is refused unread (docs/server.md, "Authentication").
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio
from anyio.abc import TaskGroup, TaskStatus
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route, Router
from starlette.types import Message, Receive, Scope, Send

from vistarl.clients.protocol import ErrorCode, JsonRpcResponse
from vistarl.httpserver.guard import carries_token, refusal_of, unauthorized
from vistarl.httpserver.metrics import ServingMetrics
from vistarl.services.server.embedded import EnvService
from vistarl.services.server.security import MCP_PATH

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
UNAUTHENTICATED_BODY_BYTES = 16 * 1024
"""How much of a body without the token `/mcp` reads to tell whether it is a JSON-RPC message; a longer one
is refused (401) unread, so that a client without the token costs the server little."""


@dataclass(frozen=True)
class _Built:
    """The MCP server once built: the SDK's `/mcp` route, and its reading of a body as a JSON-RPC message."""

    router: Router
    not_a_message: Callable[[bytes], JsonRpcResponse | None]


class LazyMCP:
    """The `/mcp` route of one env service, whose MCP server is built when a request first reaches it;
    `token` is the server's bearer token, which the route checks itself."""

    def __init__(self, service: EnvService, token: str | None = None) -> None:
        self.service = service
        self.expected = None if token is None else token.encode()
        self._tasks: TaskGroup | None = None
        self._built: _Built | None = None
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
        """Refuse GET; answer a body that is no JSON-RPC message with its JSON-RPC error; check the token;
        hand the message to the SDK's `/mcp` route, building it first if this is the first request."""
        metrics = self.service.metrics
        authorized = carries_token(dict(scope["headers"]).get(b"authorization", b""), self.expected)
        if scope["method"] == "GET":
            refusal = (
                refusal_of(metrics, ErrorCode.BAD_REQUEST, NO_MCP_STREAM, {"Allow": "POST"}, status=405)
                if authorized
                else unauthorized(metrics)
            )
            await refusal(scope, receive, send)
            return
        body = await _read_body(Request(scope, receive), None if authorized else UNAUTHENTICATED_BODY_BYTES)
        if body is None:
            await unauthorized(metrics)(scope, receive, send)
            return
        built = self._built or await self._build()
        rejected = built.not_a_message(body)
        if rejected is not None:
            metrics.errors.labels(code=ErrorCode.BAD_REQUEST.value).inc()
            await JSONResponse(rejected.wire())(scope, receive, send)
        elif authorized:
            await built.router(scope, _replayed(body, receive), json_refusals(send, metrics))
        else:
            await unauthorized(metrics)(scope, receive, send)

    async def _build(self) -> _Built:
        """Import the SDK, build the tools and start their task group, once however many requests wait."""
        async with self._building:
            if self._built is None:
                if self._tasks is None:
                    raise RuntimeError("/mcp answers only inside the app's lifespan (http_running)")
                module = await anyio.to_thread.run_sync(
                    importlib.import_module, "vistarl.services.server.mcp_tools"
                )
                tools: EnvTools = module.EnvTools(self.service)
                routes = tools.http_routes()
                await self._tasks.start(_run, tools)
                self._built = _Built(Router(routes=routes), module.not_a_message)
            return self._built


async def _run(tools: EnvTools, *, task_status: TaskStatus[None]) -> None:
    """Keep the tools' streamable HTTP task group open until the lifespan cancels it."""
    async with tools.http_running():
        task_status.started()
        await anyio.sleep_forever()


async def _read_body(request: Request, limit: int | None) -> bytes | None:
    """The request's body; None once it passes `limit` bytes (the rest is left unread)."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if limit is not None and size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _replayed(body: bytes, receive: Receive) -> Receive:
    """`receive`, giving the body already read once more first (the SDK reads it again)."""
    given = False

    async def replay() -> Message:
        nonlocal given
        if given:
            return await receive()
        given = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


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
