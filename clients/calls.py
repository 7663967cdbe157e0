"""Every call of the env API described without I/O: its request, whether resending it is safe, and how
its answer becomes a model or a typed exception.

A client turns its HTTP library's answer into a `Reply` (status, body, URL, `Retry-After`) and hands it
to the call's decoder; both the request building and the error mapping live here, once.
"""

from __future__ import annotations

import contextlib
import urllib.parse
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError

from vistarl.clients.errors import EnvServerError, ProtocolError, error_for_status
from vistarl.clients.protocol import (
    ErrorResponse,
    FormatRequest,
    FormatResponse,
    HealthResponse,
    InfoResponse,
    Message,
    Observation,
    ReadyResponse,
    ResetRequest,
    ResetResponse,
    StepRequest,
    StepResponse,
    ToolCall,
)

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class Reply:
    """An HTTP answer as the shared logic sees it, whichever library fetched it."""

    status: int
    body: bytes
    url: str
    retry_after: str | None = None

    @property
    def ok(self) -> bool:
        """A 2xx status."""
        return 200 <= self.status < 300

    @property
    def text(self) -> str:
        """The body as text, for error messages."""
        return self.body.decode("utf-8", errors="replace")


# An attempt ends with an answer or with the transport exception that stopped it.
Outcome = Reply | Exception


def status_phrase(status: int) -> str:
    """The standard reason phrase of `status`, or "" for a status outside the standard."""
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""


def error_from_reply(reply: Reply) -> EnvServerError:
    """The typed exception for an error answer; a non-JSON or foreign body still gets its status's type."""
    try:
        detail = ErrorResponse.model_validate_json(reply.body).error
        code, message = detail.code, detail.message
    except ValidationError:
        code = f"http_{reply.status}"
        message = reply.text.strip()[:500] or status_phrase(reply.status)
    return error_for_status(reply.status, code, message)


def decode_reply(reply: Reply, model: type[M]) -> M:
    """Validate a success body into `model`; raise the typed exception for an error status."""
    if not reply.ok:
        raise error_from_reply(reply)
    try:
        return model.model_validate_json(reply.body)
    except ValidationError as exc:
        raise ProtocolError(f"{reply.url} answered a body that is not a {model.__name__}: {exc}") from None


def decode_closed(reply: Reply) -> bool:
    """True if the session was deleted, False if it was already gone (404); other errors raise."""
    if reply.status == 404:
        return False
    if not reply.ok:
        raise error_from_reply(reply)
    return True


def decode_ready(reply: Reply) -> ReadyResponse:
    """The ready object, which a server also sends with 503 while draining or full; other errors raise."""
    if reply.status == 503:
        with contextlib.suppress(ValidationError):
            return ReadyResponse.model_validate_json(reply.body)
    return decode_reply(reply, ReadyResponse)


@dataclass(frozen=True)
class Call(Generic[T]):
    """One API call described without I/O: the request, whether resending it is safe, and its decoder.

    A `probe` (health, readiness) reports the current state, so it is tried once and never retried.
    `session_id` names the session a call acts on, whose replica it goes to first.
    """

    method: str
    path: str
    decode: Callable[[Reply], T]
    body: BaseModel | None = None
    idempotent: bool = True
    probe: bool = False
    session_id: str | None = None

    def content(self) -> bytes | None:
        """The JSON body of the request, if it has one."""
        return None if self.body is None else self.body.model_dump_json(exclude_none=True).encode()


def reset_call(
    seed: int | None,
    task_id: str | None,
    sample: Mapping[str, Any] | None,
    options: Mapping[str, Any] | None,
    session_id: str | None,
    format: bool,
) -> Call[ResetResponse]:
    """POST /reset. Not resent after a lost response, which could have started a second session."""
    body = ResetRequest(
        seed=seed,
        task_id=task_id,
        sample=None if sample is None else dict(sample),
        options=dict(options or {}),
        session_id=session_id,
        format=format,
    )
    return Call("POST", "/reset", lambda r: decode_reply(r, ResetResponse), body, idempotent=False)


def step_call(
    session_id: str, action: str | ToolCall, request_id: str | None, format: bool
) -> Call[StepResponse]:
    """POST /step of the response text, or of a call of one of the env's tools, with a request_id (a fresh
    uuid4 unless given), which makes resending it safe."""
    call, text = (action, "") if isinstance(action, ToolCall) else (None, action)
    body = StepRequest(
        session_id=session_id,
        action=text,
        tool_call=call,
        request_id=request_id or uuid.uuid4().hex,
        format=format,
    )
    return Call("POST", "/step", lambda r: decode_reply(r, StepResponse), body, session_id=session_id)


def format_call(observation: Observation | Mapping[str, Any]) -> Call[Message]:
    """POST /format: the chat message the server's environment makes of an observation."""
    body = FormatRequest(observation=Observation.model_validate(observation))
    return Call("POST", "/format", lambda r: decode_reply(r, FormatResponse).message, body)


def close_call(session_id: str) -> Call[bool]:
    """DELETE /sessions/{id}; a session that is already gone is not an error."""
    path = f"/sessions/{urllib.parse.quote(session_id, safe='')}"
    return Call("DELETE", path, decode_closed, session_id=session_id)


INFO_CALL = Call("GET", "/info", lambda r: decode_reply(r, InfoResponse))
HEALTH_CALL = Call("GET", "/health", lambda r: decode_reply(r, HealthResponse), probe=True)
READY_CALL = Call("GET", "/ready", decode_ready, probe=True)
