"""Typed exceptions of the client package: one class per kind of failure a caller handles differently.

Server errors carry the server's machine-readable `code` (see `vistarl.clients.protocol.ErrorCode`), its
`message` and the HTTP `status`, so a caller can `except SessionNotFoundError` instead of parsing text.
"""

from __future__ import annotations


class ImageError(ValueError):
    """An image payload that cannot be accepted: bad data URL, bad base64, too large, or not an image."""


class EnvClientError(Exception):
    """Base of every error raised by `EnvClient` / `AsyncEnvClient`."""


class EnvConnectionError(EnvClientError):
    """The server could not be reached (or kept timing out) within the retry budget."""


class ProtocolError(EnvClientError):
    """The server answered success with a body that does not match the wire protocol."""


class EnvServerError(EnvClientError):
    """The server answered with an error status; `code` is its machine-readable error code."""

    def __init__(self, code: str, message: str, status: int) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.code = code
        self.message = message
        self.status = status


class BadRequestError(EnvServerError):
    """400 / 422: the request was malformed or failed validation."""


class AuthError(EnvServerError):
    """401 / 403: missing or wrong bearer token."""


class SessionNotFoundError(EnvServerError):
    """404: the session is unknown (never created, closed, or expired)."""


class TaskNotFoundError(EnvServerError):
    """404 `task_not_found`: a reset's `task_id` names no split or row the server holds."""


class EpisodeDoneError(EnvServerError):
    """409: a step after the episode ended."""


class SessionExistsError(EnvServerError):
    """409 `session_exists`: a reset named a session id that is already in use."""


class RequestIdReusedError(EnvServerError):
    """409 `request_id_reused`: a step reused a `request_id` of the session with a different action."""


class PayloadTooLargeError(EnvServerError):
    """413: the request body, an image or an action exceeds the server's limits."""


class ServerBusyError(EnvServerError):
    """429 / 503: the server stayed at capacity (or draining) through every retry."""


class ServerError(EnvServerError):
    """5xx: the server failed while handling the request."""


_BY_STATUS: dict[int, type[EnvServerError]] = {
    400: BadRequestError,
    401: AuthError,
    403: AuthError,
    404: SessionNotFoundError,
    409: EpisodeDoneError,
    413: PayloadTooLargeError,
    422: BadRequestError,
    429: ServerBusyError,
    503: ServerBusyError,
}


_BY_CODE: dict[str, type[EnvServerError]] = {
    "session_exists": SessionExistsError,
    "task_not_found": TaskNotFoundError,
    "request_id_reused": RequestIdReusedError,
}


def error_for_status(status: int, code: str, message: str) -> EnvServerError:
    """The typed exception for an error answer: by code where the status is shared, else by status,
    else `ServerError` for any other 5xx and the base class for any other 4xx."""
    cls = _BY_CODE.get(code) or _BY_STATUS.get(status) or (ServerError if status >= 500 else EnvServerError)
    return cls(code, message, status)
