"""Error answers of vistarl's servers: every failure becomes an `ErrorResponse` body.

`ServiceError` is what a server's own code raises; the handlers installed by `install_error_handlers`
turn it, FastAPI's validation errors, HTTP errors (404, 405, 413) and unexpected crashes into
`{"error": {"code", "message"}}` with the status from `ERROR_STATUS`, counting each by code.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from vistarl.clients.protocol import ERROR_STATUS, ErrorCode, ErrorResponse
from vistarl.httpserver.metrics import ServingMetrics

logger = logging.getLogger(__name__)

VALUE_ERROR_PREFIX = "Value error, "
"""What pydantic puts before the message of a ValueError raised in a validator; left out of answers."""

_CODE_BY_STATUS = {
    401: ErrorCode.UNAUTHORIZED,
    404: ErrorCode.NOT_FOUND,
    413: ErrorCode.PAYLOAD_TOO_LARGE,
}


class ServiceError(Exception):
    """A failure with a wire error code; `headers` go on the answer (e.g. `Retry-After`)."""

    def __init__(self, code: ErrorCode, message: str, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.headers = dict(headers or {})


def error_response(
    code: ErrorCode, message: str, headers: Mapping[str, str] | None = None, status: int | None = None
) -> JSONResponse:
    """An `ErrorResponse` body with the status of `code` (or `status`, for HTTP-level errors like 405)."""
    body = ErrorResponse.of(code, message).model_dump()
    return JSONResponse(body, status_code=status or ERROR_STATUS[code], headers=dict(headers or {}))


def describe_validation_errors(errors: Iterable[Mapping[str, Any]], prefix: str = "") -> str:
    """One line naming each invalid field: `body.session_id: Field required; body.seed: ...`, each message as
    the validator wrote it."""
    parts = []
    for err in errors:
        loc = ".".join(str(p) for p in (prefix, *err.get("loc", ())) if p != "")
        message = str(err.get("msg", "invalid")).removeprefix(VALUE_ERROR_PREFIX)
        parts.append(f"{loc}: {message}" if loc else message)
    return "; ".join(parts)


def invalid_body(errors: Sequence[Mapping[str, Any]], prefix: str = "") -> ServiceError:
    """The error for a body that failed validation: 400 if it is not JSON at all, else 422 naming fields."""
    if any(err.get("type") == "json_invalid" for err in errors):
        detail = "; ".join(str(err.get("ctx", {}).get("error", err.get("msg"))) for err in errors)
        return ServiceError(ErrorCode.BAD_REQUEST, f"malformed JSON body: {detail}")
    return ServiceError(ErrorCode.VALIDATION_ERROR, describe_validation_errors(errors, prefix))


def install_error_handlers(app: FastAPI, metrics: ServingMetrics) -> None:
    """Register the handlers that give every error answer the `ErrorResponse` shape."""

    def answer(
        code: ErrorCode, message: str, headers: Mapping[str, str] | None = None, status: int | None = None
    ) -> JSONResponse:
        metrics.errors.labels(code=code.value).inc()
        return error_response(code, message, headers, status)

    async def on_service_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ServiceError)
        return answer(exc.code, exc.message, exc.headers)

    async def on_validation_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        error = invalid_body(exc.errors())
        return answer(error.code, error.message)

    async def on_http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HTTPException)
        fallback = ErrorCode.INTERNAL if exc.status_code >= 500 else ErrorCode.BAD_REQUEST
        code = _CODE_BY_STATUS.get(exc.status_code, fallback)
        return answer(code, str(exc.detail), exc.headers, status=exc.status_code)

    async def on_crash(request: Request, exc: Exception) -> JSONResponse:
        logger.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
        return answer(ErrorCode.INTERNAL, f"internal error: {type(exc).__name__}")

    app.add_exception_handler(ServiceError, on_service_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(HTTPException, on_http_error)
    app.add_exception_handler(Exception, on_crash)
