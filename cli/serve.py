"""`vistarl serve NAME`: run one environment server under uvicorn."""

from __future__ import annotations

import logging
import signal
from types import FrameType
from typing import Annotated, Any

import typer


def serve(
    env: Annotated[str, typer.Argument(help="A registered env name (sokoban) or an import path.")],
    host: Annotated[str | None, typer.Option(help="Interface to bind. (env VISTARL_HOST)")] = None,
    port: Annotated[int | None, typer.Option(help="TCP port. (env VISTARL_PORT)")] = None,
    max_sessions: Annotated[
        int | None, typer.Option(help="Live sessions before resets get 503. (env VISTARL_MAX_SESSIONS)")
    ] = None,
    session_ttl: Annotated[
        float | None, typer.Option(help="Idle seconds before a session expires. (env VISTARL_SESSION_TTL_S)")
    ] = None,
    reaper_interval: Annotated[
        float | None, typer.Option(help="Seconds between reaper rounds. (env VISTARL_REAPER_INTERVAL_S)")
    ] = None,
    max_body_bytes: Annotated[
        int | None, typer.Option(help="Request body limit in bytes. (env VISTARL_MAX_BODY_BYTES)")
    ] = None,
    log_level: Annotated[str | None, typer.Option(help="uvicorn log level. (env VISTARL_LOG_LEVEL)")] = None,
) -> None:
    """Serve an environment over HTTP. Set VISTARL_API_TOKEN to require a bearer token."""
    import uvicorn

    from services.app import create_app
    from services.env_api import load_env_factory
    from services.settings import ServerSettings

    flags: dict[str, Any] = {
        "host": host,
        "port": port,
        "max_sessions": max_sessions,
        "session_ttl_s": session_ttl,
        "reaper_interval_s": reaper_interval,
        "max_body_bytes": max_body_bytes,
        "log_level": log_level,
    }
    try:
        settings = ServerSettings(**{name: value for name, value in flags.items() if value is not None})
        factory = load_env_factory(env)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    signal.signal(signal.SIGTERM, _exit_cleanly)
    logging.basicConfig(level="DEBUG" if settings.log_level == "trace" else settings.log_level.upper())
    uvicorn.run(
        create_app(factory, settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        timeout_graceful_shutdown=int(settings.shutdown_timeout_s),
    )


def _exit_cleanly(signum: int, frame: FrameType | None) -> None:
    """SIGTERM is how a server is normally stopped: exit 0 (uvicorn re-raises it after draining)."""
    raise SystemExit(0)


def register(app: typer.Typer) -> None:
    """Add `serve` to the `vistarl` command line."""
    app.command()(serve)
