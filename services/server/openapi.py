"""What `/openapi.json` declares beyond FastAPI's defaults, so that it describes the wire exactly.

Routes pass these as FastAPI's documented `responses=` and `dependencies=`:
- `errors(...)`: each error status a route can answer, with the `ErrorResponse` body, its error codes
  (from `vistarl.clients.protocol.ERROR_STATUS`) and its headers; `default` covers any other status (405,
  ...), which also keeps FastAPI from declaring its own 422 body, which the server never sends;
- `READY_RESPONSES`: `/ready` answers 503 with the ready object, not an error body;
- `METRICS_RESPONSES`: `/metrics` is Prometheus text;
- `guarded_router`: a router whose routes declare the bearer token scheme and its 401. It checks
  nothing: `RequestGuard` enforces the token before routing (docs/server.md, "Authentication").
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Security
from fastapi.security import HTTPBearer

from vistarl.clients.protocol import ERROR_STATUS, ErrorResponse, ReadyResponse

Responses = dict[int | str, dict[str, Any]]

RETRY_AFTER = {
    "Retry-After": {
        "description": "Seconds to wait before retrying.",
        "schema": {"type": "integer"},
        "required": True,
    }
}
WWW_AUTHENTICATE = {
    "WWW-Authenticate": {"description": "The scheme: Bearer.", "schema": {"type": "string"}, "required": True}
}
_HEADERS = {401: WWW_AUTHENTICATE, 503: RETRY_AFTER}

READY_RESPONSES: Responses = {
    503: {"model": ReadyResponse, "description": "Not ready: draining or full.", "headers": RETRY_AFTER}
}
METRICS_RESPONSES: Responses = {
    200: {
        "description": "Prometheus text exposition.",
        "content": {"text/plain": {"schema": {"type": "string"}}},
    }
}

_bearer = HTTPBearer(
    scheme_name="bearer",
    description=(
        "Authorization: Bearer <token> when the server has one; /health, /ready, /metrics, /schema and "
        "/metadata are open, and /mcp answers a body that is no JSON-RPC message without it."
    ),
    auto_error=False,
)


def errors(*statuses: int) -> Responses:
    """`responses=` for a route that answers these error statuses, plus `default` for any other."""
    declared: Responses = {status: _error(status) for status in statuses}
    declared["default"] = {"model": ErrorResponse, "description": "Any other error (e.g. 405 wrong method)."}
    return declared


def guarded_router(token_required: bool) -> APIRouter:
    """The router of the routes that need the token: on a server that has one, each declares the bearer
    scheme and the 401 answer; each declares the `default` error answer."""
    if not token_required:
        return APIRouter(responses=errors())
    return APIRouter(dependencies=[Security(_bearer)], responses=errors(401))


def _error(status: int) -> dict[str, Any]:
    """One error status: the error body, the codes that come with it, and its headers."""
    codes = ", ".join(
        sorted(code.value for code, code_status in ERROR_STATUS.items() if code_status == status)
    )
    answer: dict[str, Any] = {"model": ErrorResponse, "description": f"Error codes: {codes}."}
    if status in _HEADERS:
        answer["headers"] = _HEADERS[status]
    return answer
