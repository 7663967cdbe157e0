"""The environment server: `create_app(env_factory, settings)` serves one env over the wire protocol.

Endpoints (see docs/server.md): POST /reset, POST /step, POST /format, DELETE /sessions/{id}, GET /info,
GET /health, GET /ready, GET /metrics; MCP at /mcp; OpenEnv's WebSocket sessions at /ws (and
/sessions/{id}/ws), with GET /schema, GET /metadata and GET /state; the browser playground at GET /play and
GET /play/replay. The sessions and what runs them come from `embedded` (session rules in `sessions`, tasks in
`tasks`, where envs run in `env_pool`); the open paths and CORS in `security`, what the OpenAPI schema adds in
`openapi`, the lean path of the env endpoints in `json_route`, tool calls as actions in `tool_calls`, the MCP
tools in `mcp_tools`, OpenEnv's protocol in `openenv_ws`, the pages in `play` (all in
`vistarl.services.server`); error shapes and the request guard (auth, the body limit) come from `httpserver`,
shared with the engine server. This module only wires them together.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from fastapi import FastAPI, Response
from fastapi.middleware.cors import CORSMiddleware

from vistarl.clients.protocol import (
    FormatRequest,
    FormatResponse,
    HealthResponse,
    InfoResponse,
    ReadyResponse,
    ResetRequest,
    ResetResponse,
    StepRequest,
    StepResponse,
)
from vistarl.httpserver.errors import install_error_handlers
from vistarl.httpserver.guard import RequestGuard
from vistarl.services.env_api import EnvFactory
from vistarl.services.server.embedded import EnvService
from vistarl.services.server.json_route import JSONRoute, LeanRoutes
from vistarl.services.server.mcp_route import LazyMCP
from vistarl.services.server.openapi import METRICS_RESPONSES, READY_RESPONSES, errors, guarded_router
from vistarl.services.server.openenv_ws import OpenEnvRoutes
from vistarl.services.server.play import PLAY_PATHS, play_routes
from vistarl.services.server.security import OPEN_PATHS, ROUTE_GUARDED_PATHS, cors_options
from vistarl.services.server.settings import ServerSettings
from vistarl.services.server.tool_calls import ToolActions


def create_app(env_factory: EnvFactory, settings: ServerSettings | None = None) -> FastAPI:
    """A FastAPI app hosting sessions of `env_factory`, bounded and configured by `settings`."""
    service = EnvService(env_factory, settings)
    settings, metrics, manager = service.settings, service.metrics, service.manager
    tool_actions = ToolActions(env_factory, settings.max_action_chars)
    token = None if settings.api_token is None else settings.api_token.get_secret_value()
    mcp = LazyMCP(service, token)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        """Start the env pool, the idle reaper and the MCP endpoint's task group; on shutdown drain, stop
        the reaper and close every env."""
        await service.start()
        try:
            async with mcp.http_running():
                yield
        finally:
            await service.stop()

    app = FastAPI(
        title=f"vistarl environment: {env_factory.name}",
        version=env_factory.version,
        description=env_factory.description,
        lifespan=lifespan,
        telemetry={"tracing": settings.otel, "metrics": settings.otel, "logs": settings.otel},
    )
    install_error_handlers(app, metrics)
    guarded = guarded_router(token_required=token is not None)

    async def reset(request: ResetRequest) -> bytes:
        """Start an episode; returns the session id and the first observation."""
        return (await manager.reset(request)).body

    async def step(request: StepRequest) -> bytes:
        """Apply one action (the response text, or a call of one of the env's tools) to a session."""
        return (await manager.step(tool_actions.resolve(request))).body

    async def format_observation(request: FormatRequest) -> bytes:
        """Turn an observation into the env's chat message."""
        return await manager.format(request)

    env_routes = (
        ("/reset", reset, ResetResponse, errors(400, 404, 409, 413, 422, 500, 503)),
        ("/step", step, StepResponse, errors(400, 404, 409, 413, 422, 500, 503)),
        ("/format", format_observation, FormatResponse, errors(400, 413, 422, 500)),
    )
    for path, endpoint, answer, failures in env_routes:
        guarded.add_api_route(
            path,
            endpoint,
            methods=["POST"],
            response_model=answer,
            responses=failures,
            route_class_override=JSONRoute,
        )

    @guarded.delete("/sessions/{session_id}", status_code=204, responses=errors(404, 500, 503))
    async def delete_session(session_id: str) -> Response:
        """End a session and free its slot."""
        await manager.close(session_id)
        return Response(status_code=204)

    @guarded.get("/info")
    async def get_info() -> InfoResponse:
        """What this env is, how to talk to it, the tasks it holds and the server's limits."""
        return service.info

    openenv = OpenEnvRoutes(service, tool_actions)
    app.get("/schema", responses=errors())(openenv.schema)  # open, as OpenEnv's: they describe the env
    app.get("/metadata", responses=errors())(openenv.metadata)
    guarded.get("/state", responses=errors(404, 503))(openenv.state)
    app.add_api_websocket_route("/ws", openenv.socket)
    app.add_api_websocket_route("/sessions/{session_id}/ws", openenv.socket)

    @app.get("/ready", responses=READY_RESPONSES)
    async def ready(response: Response) -> ReadyResponse:
        """Readiness: 503 with the same object while draining or at capacity; never needs a token."""
        state = await manager.ready()
        if not state.ready:
            response.status_code = 503
            response.headers.update(manager.retry_after())
        return state

    @app.get("/metrics", response_class=Response, responses=METRICS_RESPONSES)
    async def get_metrics() -> Response:
        """Prometheus text exposition of this server's registry; never needs a token."""
        return metrics.response()

    @app.get("/health", responses=errors())
    async def health() -> HealthResponse:
        """Liveness: the process answers; never needs a token."""
        return HealthResponse()

    if not settings.otel:  # added first, so innermost; with tracing on, FastAPI's router names the spans
        app.add_middleware(LeanRoutes, routes=guarded.routes, handlers=app.exception_handlers)
    app.add_middleware(
        RequestGuard,
        max_bytes=settings.max_body_bytes,
        metrics=metrics,
        token=token,
        open_paths=OPEN_PATHS | PLAY_PATHS | ROUTE_GUARDED_PATHS,
    )
    if settings.cors_origins:  # added last, so outermost: a preflight needs no token
        app.add_middleware(CORSMiddleware, **cors_options(settings.cors_origins))

    app.include_router(guarded)
    app.router.routes.extend([*mcp.http_routes(), *play_routes()])
    return app
