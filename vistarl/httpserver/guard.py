"""The request guard: bearer-token auth and the request body size limit, in one pure ASGI middleware.

It runs before routing and before the body is parsed, so an unauthenticated or oversized request costs
the server almost nothing, and it reads the headers of every request once. Its refusals are
`ErrorResponse` bodies like every other error, counted by code. Each server names the paths that need
no token: its probes, say, or a route that checks the token itself (`carries_token`, `unauthorized`).

A WebSocket handshake needs the token too. Since OpenEnv's client sends no headers of its own, there the
token may also come as the password of HTTP Basic credentials, which a WebSocket client sends for the
user part of its URL (`ws://user:TOKEN@host:port`).
"""

from __future__ import annotations

import base64
import binascii
import hmac

from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from vistarl.clients.protocol import ErrorCode
from vistarl.httpserver.errors import error_response
from vistarl.httpserver.metrics import ServingMetrics

NO_TOKEN = "missing or invalid bearer token"


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
        metrics: ServingMetrics,
        open_paths: frozenset[str],
        token: str | None = None,
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.metrics = metrics
        self.expected = None if token is None else token.encode()
        self.open_paths = open_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        authorization = declared = b""
        for name, value in scope["headers"]:  # ASGI header names are lower-case
            if name == b"authorization":
                authorization = value
            elif name == b"content-length":
                declared = value
        if not self._authorized(scope["path"], authorization, websocket=kind == "websocket"):
            refusal = unauthorized(self.metrics)
        elif kind == "websocket":  # no body: the server bounds each message (uvicorn's ws_max_size)
            await self.app(scope, receive, send)
            return
        elif declared.isdigit() and int(declared) > self.max_bytes:
            too_large = self._too_large(f"{declared.decode()} bytes")
            refusal = refusal_of(self.metrics, ErrorCode.PAYLOAD_TOO_LARGE, too_large)
        else:
            await self.app(scope, receive if declared.isdigit() else self._counting(receive), send)
            return
        if kind == "websocket" and "websocket.http.response" not in scope.get("extensions", {}):
            await send({"type": "websocket.close", "code": 1008, "reason": NO_TOKEN})
            return
        await refusal(scope, receive, send)

    def _authorized(self, path: str, authorization: bytes, *, websocket: bool = False) -> bool:
        """Whether the request may pass: no token is set, the path is open, or it carries the token."""
        return path in self.open_paths or carries_token(authorization, self.expected, websocket=websocket)

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

    def _too_large(self, size: str) -> str:
        return f"request body of {size} exceeds the limit of {self.max_bytes} bytes"


def carries_token(authorization: bytes, expected: bytes | None, *, websocket: bool = False) -> bool:
    """Whether an `Authorization` header value carries the `expected` token (always, when none is set): as
    a bearer token, the scheme name in any case, or, on a WebSocket handshake, as the password of Basic
    credentials. Compared in constant time."""
    if expected is None:
        return True
    scheme, _, credentials = authorization.partition(b" ")
    scheme, credentials = scheme.lower(), credentials.strip(b" ")
    if websocket and scheme == b"basic":
        credentials = _basic_password(credentials)
    elif scheme != b"bearer":
        return False
    return hmac.compare_digest(credentials, expected)


def unauthorized(metrics: ServingMetrics) -> JSONResponse:
    """The 401 answer to a request without the token, counted."""
    return refusal_of(metrics, ErrorCode.UNAUTHORIZED, NO_TOKEN, {"WWW-Authenticate": "Bearer"})


def refusal_of(
    metrics: ServingMetrics,
    code: ErrorCode,
    message: str,
    headers: dict[str, str] | None = None,
    status: int | None = None,
) -> JSONResponse:
    """An `ErrorResponse` that middleware answers instead of calling the app, counted by code."""
    metrics.errors.labels(code=code.value).inc()
    return error_response(code, message, headers, status)


def _basic_password(credentials: bytes) -> bytes:
    """The password of HTTP Basic credentials (`base64(user:password)`); empty when they are malformed."""
    try:
        decoded = base64.b64decode(credentials, validate=True)
    except (binascii.Error, ValueError):
        return b""
    return decoded.partition(b":")[2]
