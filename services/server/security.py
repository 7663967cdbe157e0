"""The request guard: bearer-token auth and the request body size limit, in one pure ASGI middleware;
and the CORS options that let browser pages of chosen origins past it.

It runs before routing and before the body is parsed, so an unauthenticated or oversized request costs
the server almost nothing, and it reads the headers of every request once. Its refusals are
`ErrorResponse` bodies like every other error. At `/mcp` it also answers GET with 405 (the stateless
transport has no server-initiated messages to stream) and gives the MCP SDK's plain-text refusals (421,
403) that body too.

The probe and scrape paths stay open with a token set (docs/server.md, "Authentication"): Kubernetes
probes and Prometheus send no token, and these paths reveal only counts, never a session or an observation.
So does `/openapi.json`, which describes the wire and no secret, so that clients can be generated from it.
"""

from __future__ import annotations

import hmac
from typing import Any

from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from clients.protocol import ErrorCode
from services.server.errors import error_response
from services.server.metrics import ServerMetrics

OPEN_PATHS = frozenset({"/health", "/ready", "/metrics", "/openapi.json"})
MCP_PATH = "/mcp"
MCP_HEADERS = ("mcp-protocol-version", "mcp-session-id", "mcp-method", "mcp-name", "last-event-id")
NO_MCP_STREAM = (
    "GET /mcp: this server sends no server-initiated messages, so it opens no SSE stream; "
    "POST each JSON-RPC request (MCP's streamable HTTP allows 405 here)"
)
PLAIN_REFUSALS = {403: ErrorCode.FORBIDDEN, 421: ErrorCode.MISDIRECTED}
"""The statuses of the MCP SDK's plain-text refusals (its DNS-rebinding guard: a foreign `Origin`, a
foreign `Host`), answered as `ErrorResponse` bodies with these codes."""
LOOPBACK_HINT = "a server bound to a loopback address answers /mcp only for loopback Host and Origin headers"


def cors_options(origins: list[str]) -> dict[str, Any]:
    """Starlette `CORSMiddleware` options for browser pages of `origins` (docs/server.md, "Browsers"):
    the methods and headers of the env API and of MCP's streamable HTTP, and `Retry-After` and MCP's
    session header readable by the page."""
    return {
        "allow_origins": origins,
        "allow_methods": ["GET", "POST", "DELETE"],
        "allow_headers": [*MCP_HEADERS, "authorization", "content-type"],
        "expose_headers": ["retry-after", "mcp-session-id"],
    }


class RequestGuard:
    """Answer 401 unless `Authorization: Bearer <token>` matches (when a token is set; the scheme name in
    any case, as RFC 7235 has it), 413 when a body exceeds `max_bytes`; paths in `open_paths` need no
    token.

    Auth comes first, so no body is read before it. A declared Content-Length over the limit is refused
    before reading anything; a declared length within it bounds what the server delivers. A body without
    one (chunked) is counted as it streams: the read that crosses the limit raises a 413
    `HTTPException`, which FastAPI passes on to the error handlers.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_bytes: int,
        metrics: ServerMetrics,
        token: str | None = None,
        open_paths: frozenset[str] = OPEN_PATHS,
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.metrics = metrics
        self.expected = None if token is None else token.encode()
        self.open_paths = open_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        authorization = declared = b""
        for name, value in scope["headers"]:  # ASGI header names are lower-case
            if name == b"authorization":
                authorization = value
            elif name == b"content-length":
                declared = value
        if not self._authorized(scope["path"], authorization):
            refusal = self._refusal(
                ErrorCode.UNAUTHORIZED, "missing or invalid bearer token", {"WWW-Authenticate": "Bearer"}
            )
        elif declared.isdigit() and int(declared) > self.max_bytes:
            too_large = self._too_large(f"{declared.decode()} bytes")
            refusal = self._refusal(ErrorCode.PAYLOAD_TOO_LARGE, too_large)
        elif scope["path"] == MCP_PATH and scope["method"] == "GET":
            refusal = self._refusal(ErrorCode.BAD_REQUEST, NO_MCP_STREAM, {"Allow": "POST"}, status=405)
        else:
            send = self._json_refusals(send) if scope["path"] == MCP_PATH else send
            await self.app(scope, receive if declared.isdigit() else self._counting(receive), send)
            return
        await refusal(scope, receive, send)

    def _authorized(self, path: str, authorization: bytes) -> bool:
        """Whether the request may pass: no token is set, the path is open, or it carries the token."""
        if self.expected is None or path in self.open_paths:
            return True
        scheme, _, credentials = authorization.partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(credentials.strip(b" "), self.expected)

    def _counting(self, receive: Receive) -> Receive:
        """`receive`, raising 413 once the body read so far exceeds `max_bytes`."""
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise HTTPException(413, self._too_large(f"more than {self.max_bytes} bytes"))
            return message

        return counting_receive

    def _json_refusals(self, send: Send) -> Send:
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
            answer = self._refusal(PLAIN_REFUSALS[status], f"{text}: {LOOPBACK_HINT}", status=status)
            await send({"type": "http.response.start", "status": status, "headers": answer.raw_headers})
            await send({"type": "http.response.body", "body": answer.body})

        return json_send

    def _refusal(
        self, code: ErrorCode, message: str, headers: dict[str, str] | None = None, status: int | None = None
    ) -> JSONResponse:
        """An `ErrorResponse` answered instead of calling the app, counted by code."""
        self.metrics.errors.labels(code=code.value).inc()
        return error_response(code, message, headers, status)

    def _too_large(self, size: str) -> str:
        return f"request body of {size} exceeds the limit of {self.max_bytes} bytes"
