"""`vistarl mcp NAME`: serve an environment's sessions as MCP tools over stdio, for desktop agents."""

from __future__ import annotations

import typer

from vistarl.cli.options import DataPaths, EnvName, LogLevel, MaxSessions, SessionTtl
from vistarl.cli.serve import log_to_stderr, settings_from


def mcp(
    env: EnvName,
    max_sessions: MaxSessions = None,
    session_ttl: SessionTtl = None,
    data: DataPaths = None,
    log_level: LogLevel = None,
) -> None:
    """Serve an env over MCP on stdin/stdout (tools start_episode, act, observe, end_episode), its envs
    in this process, with the session rules of `vistarl serve`; logs go to stderr."""
    import anyio

    from vistarl.services.env_api import load_env_factory
    from vistarl.services.server.embedded import EnvService
    from vistarl.services.server.mcp_tools import serve_stdio

    flags = {"max_sessions": max_sessions, "session_ttl_s": session_ttl, "data": data, "log_level": log_level}
    try:
        settings = settings_from(flags)
        service = EnvService(load_env_factory(env), settings)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    log_to_stderr(settings.log_level)
    anyio.run(serve_stdio, service)


def register(app: typer.Typer) -> None:
    """Add `mcp` to the `vistarl` command line."""
    app.command()(mcp)
