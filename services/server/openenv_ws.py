"""OpenEnv's WebSocket session protocol on every env server: `/ws`, `/schema`, `/metadata` and `/state`, as
the `openenv-core` release of `vistarl.clients.protocol.OPENENV_CORE_VERSION` defines them, so that
OpenEnv's `EnvClient` (and TRL, which drives envs through it) plays a vistarl env (docs/agents.md, "OpenEnv
and TRL").

A socket holds one vistarl session at a time, run by the same `SessionManager` as `/reset` and `/step`:
the same limits, task rules, metrics and session store. A `reset` message starts a session (ending the
socket's previous one), `step` steps it, `state` reports it, `mcp` calls the env's tools on it as JSON-RPC
(`tools/list`, `tools/call`), `close` ends it and the socket. Every answer is `{"type": "observation" |
"state" | "mcp" | "error", "data": ...}` (`vistarl.clients.protocol.OpenEnvReply`); an error leaves the
socket open, as OpenEnv's server does.

The session ends with the socket when the client ends it (a `close` message or a close frame). When the
server shuts down, or the connection drops without a close frame, the session stays until its idle TTL,
and a new socket continues it: `/ws?session_id=ID`, or `/sessions/ID/ws` (where OpenEnv's client, which
appends `/ws` to its base URL, reaches it), on this replica or, with a shared store, on any other. A step
resent there with the same `request_id` is answered once. A socket idle for the session TTL is closed.
The bearer token and the message size limit are checked at the handshake and by uvicorn
(`vistarl.httpserver.guard.RequestGuard`, `vistarl/cli/serve.py`).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import anyio
from pydantic import ValidationError
from starlette.websockets import WebSocket

from vistarl.clients.protocol import (
    JSONRPC_INVALID_PARAMS,
    JSONRPC_INVALID_REQUEST,
    JSONRPC_METHOD_NOT_FOUND,
    JSONRPC_SERVER_ERROR,
    OPENENV_ERROR_CODES,
    ErrorCode,
    JsonRpcRequest,
    JsonRpcResponse,
    OpenEnvAction,
    OpenEnvError,
    OpenEnvErrorCode,
    OpenEnvMessage,
    OpenEnvMetadata,
    OpenEnvObservation,
    OpenEnvReply,
    OpenEnvReset,
    OpenEnvSchema,
    OpenEnvState,
    ResetResponse,
    StepRequest,
    StepResponse,
    ToolCall,
)
from vistarl.httpserver.errors import ServiceError, describe_validation_errors, error_response
from vistarl.services.env_api import EnvFactory
from vistarl.services.server.embedded import EnvService
from vistarl.services.server.tool_calls import ToolActions

__all__ = ["OpenEnvRoutes"]

KEPT_ON_DISCONNECT = frozenset({1005, 1006, 1012})
"""Disconnect codes that leave the session to its TTL: no close frame (1005, 1006: the connection was
lost) and the server's own shutdown (1012); any close frame from the client ends it."""


class OpenEnvRoutes:
    """The endpoints of one env service in OpenEnv's protocol: `socket` for `/ws` (and `/sessions/ID/ws`),
    `schema`, `metadata`, `state`."""

    def __init__(self, service: EnvService, tool_actions: ToolActions) -> None:
        self.service = service
        self.tool_actions = tool_actions

    async def socket(self, websocket: WebSocket) -> None:
        """Serve one `/ws` connection until it closes."""
        await OpenEnvSocket(websocket, self.service, self.tool_actions).serve()

    async def schema(self) -> OpenEnvSchema:
        """The JSON schemas of this env's actions, observations and states on `/ws`."""
        return _schema()

    async def metadata(self) -> OpenEnvMetadata:
        """The env's name, version and description; how to play it as the readme."""
        factory = self.service.factory
        return OpenEnvMetadata(
            name=factory.name,
            description=factory.description,
            version=factory.version,
            readme_content=f"{factory.system_prompt}\n\nActions: {factory.action_format}",
        )

    async def state(self, session_id: str | None = None) -> OpenEnvState:
        """A session's state: its id, its steps so far and whether it is done; without `session_id`, the
        state of no episode yet, as OpenEnv's server answers `GET /state` (a fresh env's)."""
        return await session_state(self.service, session_id)


async def session_state(service: EnvService, session_id: str | None) -> OpenEnvState:
    """The OpenEnv state of `session_id` (404 `session_not_found` when unknown), or a fresh one for None."""
    if session_id is None:
        return OpenEnvState()
    seen = await service.manager.progress(session_id)
    return OpenEnvState(episode_id=session_id, step_count=seen.version, done=seen.done)


@functools.cache
def _schema() -> OpenEnvSchema:
    return OpenEnvSchema(
        action=OpenEnvAction.model_json_schema(),
        observation=OpenEnvObservation.model_json_schema(),
        state=OpenEnvState.model_json_schema(),
    )


class OpenEnvSocket:
    """One `/ws` connection: its messages answered in order, over at most one session at a time."""

    def __init__(self, websocket: WebSocket, service: EnvService, tool_actions: ToolActions) -> None:
        self.websocket = websocket
        self.service = service
        self.manager = service.manager
        self.tool_actions = tool_actions
        self.session_id: str | None = None
        self.format = False

    async def serve(self) -> None:
        """Accept (attaching to the session that `/sessions/ID/ws` or `?session_id=` names, 404 at the
        handshake if unknown), answer each message, then end the session unless the connection was lost
        (`KEPT_ON_DISCONNECT`)."""
        attach = self.websocket.path_params.get("session_id") or self.websocket.query_params.get("session_id")
        if attach is not None:
            try:
                await self.manager.progress(attach)
            except ServiceError as exc:
                await self._refuse(exc)
                return
            self.session_id = attach
        await self.websocket.accept()
        lost: int | None = None
        try:
            lost = await self._converse()
        finally:
            if lost not in KEPT_ON_DISCONNECT:
                await self._end_session()
        if lost is None:
            await self.websocket.close(1000)

    async def _converse(self) -> int | None:
        """Answer messages until a `close`, the session TTL without one (None: the socket is still open),
        or the client's disconnect (its code)."""
        while True:
            with anyio.move_on_after(self.service.settings.session_ttl_s) as idle:
                message = await self.websocket.receive()
            if idle.cancelled_caught:
                return None
            if message["type"] == "websocket.disconnect":
                return int(message.get("code", 1000))
            reply = await self.answer(message.get("text") or message.get("bytes") or "")
            if reply is None:
                return None
            await self.websocket.send_text(reply.model_dump_json())

    async def answer(self, raw: str | bytes) -> OpenEnvReply | None:
        """The answer to one message; None for `close`."""
        try:
            message = OpenEnvMessage.model_validate_json(raw)
        except ValidationError as exc:
            errors = exc.errors(include_url=False)
            if any(error["type"] == "json_invalid" for error in errors):
                return self._error("INVALID_JSON", ErrorCode.BAD_REQUEST, str(errors[0]["msg"]))
            return self._error(
                "VALIDATION_ERROR",
                ErrorCode.VALIDATION_ERROR,
                describe_validation_errors(errors),
            )
        if message.type == "close":
            return None
        if message.type == "mcp":
            return await self._mcp(message.data)
        handlers = {"reset": self._reset, "step": self._step, "state": self._state}
        handler = handlers.get(message.type)
        if handler is None:
            known = ", ".join([*handlers, "mcp", "close"])
            unknown = f"unknown message type {message.type!r}; the types are {known}"
            return self._error("UNKNOWN_TYPE", ErrorCode.BAD_REQUEST, unknown)
        try:
            return await handler(message.data)
        except ValidationError as exc:
            invalid = describe_validation_errors(exc.errors(include_url=False), prefix="data")
            return self._error("VALIDATION_ERROR", ErrorCode.VALIDATION_ERROR, invalid)
        except ServiceError as exc:
            return self._error(OPENENV_ERROR_CODES[exc.code], exc.code, exc.message)

    async def _reset(self, data: dict[str, Any]) -> OpenEnvReply:
        """Start a session from the reset's task (ending the socket's previous session)."""
        request = OpenEnvReset.model_validate(data)
        await self._end_session()
        answer = (await self.manager.reset(request)).typed(ResetResponse)
        self.session_id, self.format = answer.session_id, request.format
        return _observed(answer)

    async def _step(self, data: dict[str, Any]) -> OpenEnvReply:
        """Step the socket's session with the action: the response text, or a tool call."""
        action = OpenEnvAction.model_validate(data)
        return _observed(await self._turn(action.model_dump(exclude={"metadata"}, exclude_none=True)))

    async def _turn(self, fields: dict[str, Any]) -> StepResponse:
        """Step the socket's session with `fields` of a `StepRequest` (an action or a tool call)."""
        if self.session_id is None:
            raise ServiceError(ErrorCode.SESSION_NOT_FOUND, "no session on this socket: send a reset first")
        request = StepRequest.model_validate({**fields, "session_id": self.session_id, "format": self.format})
        return (await self.manager.step(self.tool_actions.resolve(request))).typed(StepResponse)

    async def _state(self, data: dict[str, Any]) -> OpenEnvReply:
        """The socket's session: its id, its steps so far and whether it is done."""
        state = await session_state(self.service, self.session_id)
        return OpenEnvReply(type="state", data=state.model_dump(mode="json"))

    async def _mcp(self, data: dict[str, Any]) -> OpenEnvReply:
        """A JSON-RPC request on the socket's session, as OpenEnv's `mcp` message: `tools/list` lists the
        env's tools, `tools/call` steps the session with a call of one (its result is the `observation`
        answer's data); every failure is a JSON-RPC error in the `mcp` answer."""
        try:
            request = JsonRpcRequest.model_validate(data)
        except ValidationError as exc:
            invalid = describe_validation_errors(exc.errors(include_url=False), prefix="data")
            return _rpc(self._rpc_failure(JSONRPC_INVALID_REQUEST, ErrorCode.VALIDATION_ERROR, invalid))
        if request.method == "tools/list":
            return _rpc(JsonRpcResponse(id=request.id, result={"tools": mcp_tools(self.service.factory)}))
        if request.method != "tools/call":
            unknown = f"method not found: {request.method!r}; the methods are tools/list and tools/call"
            return _rpc(self._rpc_failure(JSONRPC_METHOD_NOT_FOUND, ErrorCode.BAD_REQUEST, unknown, request))
        try:
            call = ToolCall.model_validate(request.params)
            turn = await self._turn({"tool_call": call.model_dump()})
        except ValidationError as exc:
            invalid = describe_validation_errors(exc.errors(include_url=False), prefix="params")
            failure = self._rpc_failure(JSONRPC_INVALID_PARAMS, ErrorCode.VALIDATION_ERROR, invalid, request)
            return _rpc(failure)
        except ServiceError as exc:
            code = JSONRPC_INVALID_PARAMS if exc.code is ErrorCode.VALIDATION_ERROR else JSONRPC_SERVER_ERROR
            return _rpc(self._rpc_failure(code, exc.code, exc.message, request))
        return _rpc(JsonRpcResponse(id=request.id, result=_observed(turn).data))

    def _rpc_failure(
        self, code: int, error_code: ErrorCode, message: str, request: JsonRpcRequest | None = None
    ) -> JsonRpcResponse:
        """A JSON-RPC error, the vistarl code HTTP would answer as its data, counted with HTTP's errors."""
        self.service.metrics.errors.labels(code=error_code.value).inc()
        request_id = None if request is None else request.id
        return JsonRpcResponse.failure(code, message, request_id, error_code=error_code.value)

    def _error(self, code: OpenEnvErrorCode, error_code: ErrorCode, message: str) -> OpenEnvReply:
        """An error answer with OpenEnv's code and the one HTTP would answer, counted with HTTP's errors."""
        self.service.metrics.errors.labels(code=error_code.value).inc()
        error = OpenEnvError(message=message, code=code, error_code=error_code.value)
        return OpenEnvReply(type="error", data=error.model_dump(mode="json"))

    async def _refuse(self, exc: ServiceError) -> None:
        """Refuse the handshake with the HTTP error answer, or close it where the server cannot send one."""
        self.service.metrics.errors.labels(code=exc.code.value).inc()
        if "websocket.http.response" in self.websocket.scope.get("extensions", {}):
            await self.websocket.send_denial_response(error_response(exc.code, exc.message))
        else:
            await self.websocket.close(1008, exc.message[:120])

    async def _end_session(self) -> None:
        """End the socket's session, if any; one already gone is no error."""
        session_id, self.session_id = self.session_id, None
        if session_id is not None:
            with contextlib.suppress(ServiceError):
                await self.manager.close(session_id)


def mcp_tools(factory: EnvFactory) -> list[dict[str, Any]]:
    """The env's tools as MCP lists them (`name`, `description`, `inputSchema`), from their OpenAI function
    schemas."""
    functions = [tool["function"] for tool in factory.tools]
    return [
        {
            "name": function["name"],
            "description": function.get("description", ""),
            "inputSchema": function.get("parameters", {"type": "object"}),
        }
        for function in functions
    ]


def _rpc(answer: JsonRpcResponse) -> OpenEnvReply:
    """A JSON-RPC answer as an `mcp` answer on the socket."""
    return OpenEnvReply(type="mcp", data=answer.wire())


def _observed(answer: ResetResponse | StepResponse) -> OpenEnvReply:
    """A reset's or a step's answer as an `observation` answer (a reset's with no reward)."""
    turn = (
        answer.model_dump(include={"reward", "done", "truncated"}) if isinstance(answer, StepResponse) else {}
    )
    observation = OpenEnvObservation(
        **answer.observation.model_dump(), **turn, info=answer.info, message=answer.message
    )
    return OpenEnvReply(type="observation", data=observation.result().model_dump(mode="json"))
