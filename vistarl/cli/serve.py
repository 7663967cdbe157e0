"""`vistarl serve NAME`: run one environment server under uvicorn."""

from __future__ import annotations

import asyncio
import logging
import signal
from types import FrameType
from typing import TYPE_CHECKING, Annotated, Any, cast

import typer

from vistarl.cli.options import DataPaths, EnvName, Host, LogLevel, MaxBodyBytes, MaxSessions, SessionTtl

if TYPE_CHECKING:
    from vistarl.services.server.settings import ServerSettings


def serve(
    env: EnvName,
    host: Host = None,
    port: Annotated[int | None, typer.Option(help="TCP port. (env VISTARL_PORT)")] = None,
    max_sessions: MaxSessions = None,
    session_ttl: SessionTtl = None,
    reaper_interval: Annotated[
        float | None, typer.Option(help="Seconds between reaper rounds. (env VISTARL_REAPER_INTERVAL_S)")
    ] = None,
    max_body_bytes: MaxBodyBytes = None,
    log_level: LogLevel = None,
    access_log: Annotated[
        bool | None,
        typer.Option(help="Log one line per request. (env VISTARL_ACCESS_LOG)", show_default=False),
    ] = None,
    session_store: Annotated[
        str | None,
        typer.Option(
            help="A redis:// URL: sessions and env states live there, shared by every replica of this env, "
            "so any replica serves any step. Unset: in this process. (env VISTARL_SESSION_STORE)"
        ),
    ] = None,
    tombstone_ttl: Annotated[
        float | None,
        typer.Option(
            help="Seconds a finished session still answers 409 and replays its final step. "
            "(env VISTARL_TOMBSTONE_TTL_S)"
        ),
    ] = None,
    env_workers: Annotated[
        int | None,
        typer.Option(
            help="Env worker processes; each session stays in the one that reset it. Default: one per "
            "usable core, or 0 on one core. 0 runs envs in threads of the server process, one process to "
            "debug. (env VISTARL_ENV_WORKERS)"
        ),
    ] = None,
    data: DataPaths = None,
    cors_origin: Annotated[
        list[str] | None,
        typer.Option(
            help="A browser origin allowed to call (CORS), or '*'. Repeatable. (env VISTARL_CORS_ORIGINS)"
        ),
    ] = None,
    timeout_keep_alive: Annotated[
        int | None,
        typer.Option(help="Idle seconds before a keep-alive connection closes. (env VISTARL_KEEP_ALIVE_S)"),
    ] = None,
) -> None:
    """Serve an environment over HTTP. Set VISTARL_API_TOKEN to require a bearer token."""
    from vistarl.services.server.gc_tuning import collect_garbage_less_often, pause_collection
    from vistarl.services.server.malloc_tuning import keep_freed_memory

    pause_collection()
    keep_freed_memory()
    import uvicorn

    from vistarl.services.env_api import load_env_factory
    from vistarl.services.server.app import create_app

    flags: dict[str, Any] = {
        "host": host,
        "port": port,
        "max_sessions": max_sessions,
        "session_ttl_s": session_ttl,
        "reaper_interval_s": reaper_interval,
        "max_body_bytes": max_body_bytes,
        "log_level": log_level,
        "access_log": access_log,
        "keep_alive_s": timeout_keep_alive,
        "session_store": session_store,
        "tombstone_ttl_s": tombstone_ttl,
        "env_workers": env_workers,
        "data": data,
        "cors_origins": cors_origin,
    }
    try:
        settings = settings_from(flags)
        app = create_app(load_env_factory(env), settings)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    collect_garbage_less_often()
    signal.signal(signal.SIGTERM, _exit_cleanly)
    log_to_stderr(settings.log_level)
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        http="httptools",
        ws=cast("type[asyncio.Protocol]", websocket_protocol),
        ws_max_size=settings.max_body_bytes,
        log_level=settings.log_level,
        access_log=settings.access_log,
        server_header=False,
        timeout_keep_alive=settings.keep_alive_s,
        timeout_graceful_shutdown=int(settings.shutdown_timeout_s),
    )


def websocket_protocol(**connection: Any) -> asyncio.Protocol:
    """uvicorn's WebSocket protocol (on websockets' sans-I/O core, uvicorn's own default) for one upgraded
    connection, imported at the first: a server that no WebSocket client asks (`/ws`) starts without the
    websockets package."""
    from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

    return WebSocketsSansIOProtocol(**connection)


def settings_from(flags: dict[str, Any]) -> ServerSettings:
    """Server settings from the flags given; a flag left out (None) falls back to `VISTARL_*` or the
    default. A ValueError names a bad value."""
    from vistarl.services.server.settings import ServerSettings

    return ServerSettings(**{name: value for name, value in flags.items() if value is not None})


def log_to_stderr(level: str) -> None:
    """The root logger at `level` (uvicorn's names; `trace` logs everything), writing to stderr."""
    logging.basicConfig(level="DEBUG" if level == "trace" else level.upper())


def _exit_cleanly(signum: int, frame: FrameType | None) -> None:
    """SIGTERM is how a server is normally stopped: exit 0 (uvicorn re-raises it after draining)."""
    raise SystemExit(0)


def register(app: typer.Typer) -> None:
    """Add `serve` to the `vistarl` command line."""
    app.command()(serve)
