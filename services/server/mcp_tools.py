"""An env's sessions as MCP tools, with the official `mcp` SDK's low-level server (docs/server.md, "MCP").

Four tools: `start_episode` (a reset), `act` (a step), `observe` (the last observation again) and
`end_episode` (a delete). They call the same `SessionManager` as the HTTP routes, so an MCP episode is a
session like any other, under the same limits and counted in the same metrics. Each answer is MCP text
(the observation text after a line with the session, reward and done) plus one image block per image,
and the same outcome as structured content.

A tool that the server does not have is a JSON-RPC error; arguments that fail validation, and every
error the HTTP API would answer (unknown session, step after done, at capacity, ...), are tool results
with `is_error` set, whose text starts with the error code. A body that is no JSON-RPC message at all
(`not_a_message`) is answered as OpenEnv's server answers it, before the SDK sees it (`mcp_route.py`).

Transports: streamable HTTP at `/mcp` inside the env server's app (stateless, JSON answers; behind the
app's request guard, so the bearer token applies), or stdio for desktop agents (`vistarl mcp ENV`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import pydantic_core
from mcp import types
from mcp.server import Server, ServerRequestContext
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.routing import BaseRoute

from vistarl.clients.protocol import (
    JSONRPC_INVALID_REQUEST,
    JSONRPC_PARSE_ERROR,
    ErrorCode,
    JsonRpcResponse,
    Observation,
    ResetRequest,
    ResetResponse,
    Seed,
    StepRequest,
    StepResponse,
)
from vistarl.httpserver.errors import ServiceError, describe_validation_errors
from vistarl.services.server.embedded import EnvService
from vistarl.services.server.security import MCP_PATH


class _Arguments(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StartEpisode(_Arguments):
    """Arguments of `start_episode`: at most one task source, and the env options."""

    seed: Seed | None = Field(default=None, description="A generated task's seed.")
    task_id: str | None = Field(
        default=None, description="A dataset row the server holds, SPLIT/INDEX (e.g. test/17)."
    )
    sample: dict[str, Any] | None = Field(
        default=None, description="A whole dataset row, images as data URLs."
    )
    options: dict[str, Any] = Field(default_factory=dict, description="The env's options.")


class Act(_Arguments):
    """Arguments of `act`: one turn's response text."""

    session_id: str = Field(description="The session that start_episode returned.")
    action: str = Field(description="The turn's response text.")
    request_id: str | None = Field(
        default=None,
        description="Makes the turn safe to resend: a retry with the same id does not step twice.",
    )


class SessionRef(_Arguments):
    """Arguments of `observe` and `end_episode`."""

    session_id: str = Field(description="The session that start_episode returned.")


class Turn(BaseModel):
    """The structured content of an answer: the session, the last turn's reward, done (and whether a budget
    of the env cut the episode: truncated), and the env's info."""

    session_id: str
    reward: float = 0.0
    done: bool = False
    truncated: bool = False
    info: dict[str, Any] = Field(default_factory=dict)


class _LastAnswer(BaseModel):
    """A reset's or a step's answer body, as `SessionManager.observe` returns either."""

    observation: Observation
    reward: float = 0.0
    done: bool = False
    truncated: bool = False
    info: dict[str, Any] = Field(default_factory=dict)


Handler = Callable[[Any], Awaitable[types.CallToolResult]]


class EnvTools:
    """The MCP server of one env service's sessions."""

    def __init__(self, service: EnvService) -> None:
        self.service = service
        self.manager = service.manager
        factory = service.factory
        self.tools: dict[str, tuple[type[_Arguments], Handler, types.Tool]] = {
            "start_episode": (
                StartEpisode,
                self._start,
                _tool("start_episode", StartEpisode, _start_text(service)),
            ),
            "act": (Act, self._act, _tool("act", Act, f"Take one turn: {factory.action_format}. {_ANSWERS}")),
            "observe": (SessionRef, self._observe, _tool("observe", SessionRef, _OBSERVE)),
            "end_episode": (SessionRef, self._end, _tool("end_episode", SessionRef, _END, output=False)),
        }
        self.server: Server[Any] = Server(
            factory.name,
            version=factory.version,
            description=factory.description,
            instructions=f"{factory.system_prompt}\n\n{_HOW_TO_PLAY}",
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
        )

    def http_routes(self) -> list[BaseRoute]:
        """The streamable HTTP endpoint at `/mcp`, for the env server's app (run `http_running` around it).

        Stateless: each request stands alone, so any replica can answer it; the env session id travels
        in the tool arguments. On a server bound to a loopback address the SDK's DNS-rebinding guard
        accepts only loopback `Host` and `Origin` headers; elsewhere the bearer token is the guard.
        """
        settings = self.service.settings
        app = self.server.streamable_http_app(
            streamable_http_path=MCP_PATH,
            stateless_http=True,
            json_response=True,
            max_request_body_size=settings.max_body_bytes,
            host=settings.host,
        )
        return list(app.routes)

    def http_running(self) -> AbstractAsyncContextManager[None]:
        """The task group the streamable HTTP endpoint answers in, for the app's lifespan."""
        return self.server.session_manager.run()

    async def serve_stdio(self) -> None:
        """Serve one client on this process's stdin and stdout until it closes them."""
        async with stdio_server() as (read, write):
            await self.server.run(read, write, self.server.create_initialization_options())

    # --- the protocol handlers ------------------------------------------------------------------

    async def _list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[tool for _, _, tool in self.tools.values()])

    async def _call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        """Validate the arguments and run the tool; its failures become `is_error` results."""
        if params.name not in self.tools:
            known = ", ".join(self.tools)
            raise MCPError(types.INVALID_PARAMS, f"unknown tool {params.name!r}; the tools are {known}")
        model, handler, _ = self.tools[params.name]
        try:
            arguments = model.model_validate(params.arguments or {})
            return await handler(arguments)
        except ValidationError as exc:
            return self._failure(ErrorCode.VALIDATION_ERROR, describe_validation_errors(exc.errors()))
        except ServiceError as exc:
            return self._failure(exc.code, exc.message)

    def _failure(self, code: ErrorCode, message: str) -> types.CallToolResult:
        """An `is_error` result, counted like the HTTP API's error answers."""
        self.service.metrics.errors.labels(code=code.value).inc()
        return types.CallToolResult(
            content=[types.TextContent(text=f"{code.value}: {message}")], is_error=True
        )

    # --- the tools ------------------------------------------------------------------------------

    async def _start(self, arguments: StartEpisode) -> types.CallToolResult:
        request = ResetRequest.model_validate(arguments.model_dump(exclude_none=True))
        answer = (await self.manager.reset(request)).typed(ResetResponse)
        return _result(Turn(session_id=answer.session_id, info=answer.info), answer.observation)

    async def _act(self, arguments: Act) -> types.CallToolResult:
        request = StepRequest.model_validate(arguments.model_dump(exclude_none=True))
        answer = (await self.manager.step(request)).typed(StepResponse)
        return _result(_turn(arguments.session_id, answer), answer.observation)

    async def _observe(self, arguments: SessionRef) -> types.CallToolResult:
        answer = _LastAnswer.model_validate_json(await self.manager.observe(arguments.session_id))
        return _result(_turn(arguments.session_id, answer), answer.observation)

    async def _end(self, arguments: SessionRef) -> types.CallToolResult:
        await self.manager.close(arguments.session_id)
        return types.CallToolResult(content=[types.TextContent(text=f"session {arguments.session_id} ended")])


def not_a_message(body: bytes) -> JsonRpcResponse | None:
    """The JSON-RPC error that OpenEnv's server answers (with 200) to a body that is no JSON-RPC message, read
    as the SDK reads one (the SDK itself answers 400); None for a message, which the SDK answers."""
    try:
        raw = pydantic_core.from_json(body)
    except ValueError as exc:
        return JsonRpcResponse.failure(JSONRPC_PARSE_ERROR, f"Parse error: {exc}")
    try:
        types.jsonrpc_message_adapter.validate_python(raw, by_name=False)
    except ValidationError:
        return JsonRpcResponse.failure(
            JSONRPC_INVALID_REQUEST, "Invalid Request: not a JSON-RPC 2.0 request, notification or response"
        )
    return None


async def serve_stdio(service: EnvService) -> None:
    """Serve `service`'s sessions over stdio until the client leaves, then drain them."""
    await service.start()
    try:
        await EnvTools(service).serve_stdio()
    finally:
        await service.stop()


_ANSWERS = (
    "Returns the next observation (text and images), the turn's reward and whether the episode is done."
)
_OBSERVE = "Show a session's current observation again, with its last turn's reward and done."
_END = "End a session and free its slot; do it when an episode is done or abandoned."
_HOW_TO_PLAY = (
    "Play through the tools: start_episode gives a session_id and the first observation; call act with your "
    "response for each turn until done is true; then end_episode."
)


def _start_text(service: EnvService) -> str:
    """`start_episode`'s description: the env, and the tasks and options it takes."""
    splits = ", ".join(f"{split.name} ({split.size} rows)" for split in service.info.datasets.splits)
    return (
        f"Start a {service.factory.name} episode: {service.factory.description} Give at most one of seed, "
        f"task_id ({'splits: ' + splits if splits else 'this server holds no datasets'}) or sample; options "
        "follow the env's schema. Returns the session_id and the first observation (text and images)."
    )


def _tool(name: str, arguments: type[BaseModel], description: str, output: bool = True) -> types.Tool:
    """The MCP listing of one tool: its arguments' JSON schema and, when it reports a turn, `Turn`'s."""
    return types.Tool(
        name=name,
        description=description,
        input_schema=arguments.model_json_schema(),
        output_schema=Turn.model_json_schema() if output else None,
    )


def _turn(session_id: str, answer: StepResponse | _LastAnswer) -> Turn:
    """A step's answer as the structured content of the tool's result."""
    fields = answer.model_dump(include={"reward", "done", "truncated", "info"})
    return Turn(session_id=session_id, **fields)


def _result(turn: Turn, observation: Observation) -> types.CallToolResult:
    """A turn as MCP content: a header line, the observation text, then its images; `turn` as structure."""
    header = f"session_id: {turn.session_id} | reward: {turn.reward:g} | done: {str(turn.done).lower()}"
    content: list[types.ContentBlock] = [types.TextContent(text=f"{header}\n\n{observation.text}")]
    content += [_image(url) for url in observation.images]
    return types.CallToolResult(content=content, structured_content=turn.model_dump(mode="json"))


def _image(data_url: str) -> types.ImageContent:
    """An image block of a base64 data URL (`data:image/png;base64,...`), as the server encodes them."""
    header, _, data = data_url.partition(",")
    mime_type = header.removeprefix("data:").partition(";")[0]
    return types.ImageContent(data=data, mime_type=mime_type)
