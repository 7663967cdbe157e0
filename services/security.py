"""Request guards as pure ASGI middlewares: bearer-token auth and the request body size limit.

Both run before routing and before the body is parsed, so an unauthenticated or oversized request costs
the server almost nothing. Their refusals are `ErrorResponse` bodies like every other error.
"""

from __future__ import annotations

import hmac

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from clients.protocol import ErrorCode
from services.errors import error_response
from services.metrics import ServerMetrics

OPEN_PATHS = frozenset({"/health"})


class BearerAuthMiddleware:
    """Answer 401 unless `Authorization: Bearer <token>` matches; paths in `open_paths` stay public."""

    def __init__(
        self, app: ASGIApp, token: str, metrics: ServerMetrics, open_paths: frozenset[str] = OPEN_PATHS
    ) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode()
        self.metrics = metrics
        self.open_paths = open_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.open_paths or self._authorized(scope):
            await self.app(scope, receive, send)
            return
        self.metrics.errors.labels(code=ErrorCode.UNAUTHORIZED.value).inc()
        response = error_response(
            ErrorCode.UNAUTHORIZED, "missing or invalid bearer token", {"WWW-Authenticate": "Bearer"}
        )
        await response(scope, receive, send)

    def _authorized(self, scope: Scope) -> bool:
        """Whether the request carries the expected token (constant-time comparison)."""
        given = Headers(scope=scope).get("authorization", "").encode()
        return hmac.compare_digest(given, self.expected)


class BodySizeLimitMiddleware:
    """Answer 413 when a request body exceeds `max_bytes`.

    A declared Content-Length over the limit is refused before reading anything. Otherwise the bytes are
    counted as they stream (a chunked body has no Content-Length); the read that crosses the limit raises
    a 413 `HTTPException`, which FastAPI passes on to the error handlers.
    """

    def __init__(self, app: ASGIApp, max_bytes: int, metrics: ServerMetrics) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_bytes:
            self.metrics.errors.labels(code=ErrorCode.PAYLOAD_TOO_LARGE.value).inc()
            response = error_response(ErrorCode.PAYLOAD_TOO_LARGE, self._too_large(f"{declared} bytes"))
            await response(scope, receive, send)
            return
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise HTTPException(413, self._too_large(f"more than {self.max_bytes} bytes"))
            return message

        await self.app(scope, counting_receive, send)

    def _too_large(self, size: str) -> str:
        return f"request body of {size} exceeds the limit of {self.max_bytes} bytes"
