"""`vistarl mcp NAME`: serve an environment's sessions as MCP tools over stdio, for desktop agents."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated, Any

import typer


def mcp(
    env: Annotated[str, typer.Argument(help="A registered env name (sokoban) or an import path.")],
    max_sessions: Annotated[
        int | None, typer.Option(help="Live sessions before starts are refused. (env VISTARL_MAX_SESSIONS)")
    ] = None,
    session_ttl: Annotated[
        float | None, typer.Option(help="Idle seconds before a session expires. (env VISTARL_SESSION_TTL_S)")
    ] = None,
    data: Annotated[
        list[Path] | None,
        typer.Option(
            "--data",
            help="A dataset whose splits the tools also serve, as task ids SPLIT/INDEX: a directory of "
            "<split>.parquet files or one parquet file named for its split. Repeatable.",
        ),
    ] = None,
    log_level: Annotated[
        str | None, typer.Option(help="Log level, on stderr. (env VISTARL_LOG_LEVEL)")
    ] = None,
) -> None:
    """Serve an env over MCP on stdin/stdout (tools start_episode, act, observe, end_episode), envs in this
    process, with the session rules of `vistarl serve`."""
    import anyio

    from services.env_api import load_env_factory
    from services.server.mcp_tools import serve_stdio
    from services.server.settings import ServerSettings

    flags: dict[str, Any] = {
        "max_sessions": max_sessions,
        "session_ttl_s": session_ttl,
        "data": data,
        "log_level": log_level,
    }
    try:
        settings = ServerSettings(**{name: value for name, value in flags.items() if value is not None})
        factory = load_env_factory(env)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    logging.basicConfig(level="DEBUG" if settings.log_level == "trace" else settings.log_level.upper())
    anyio.run(serve_stdio, factory, settings)


def register(app: typer.Typer) -> None:
    """Add `mcp` to the `vistarl` command line."""
    app.command()(mcp)
