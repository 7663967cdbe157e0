"""Typer option types that several commands share, so that a flag reads and behaves the same everywhere.

Each is an `Annotated` alias: a command names its parameter and its default (None: the setting falls back
to its `VISTARL_*` variable, then to the settings' default).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

Host = Annotated[str | None, typer.Option(help="Interface to bind. (env VISTARL_HOST)")]
MaxBodyBytes = Annotated[
    int | None, typer.Option(help="Request body limit in bytes. (env VISTARL_MAX_BODY_BYTES)")
]
MaxSessions = Annotated[
    int | None, typer.Option(help="Live sessions before new episodes get 503. (env VISTARL_MAX_SESSIONS)")
]
SessionTtl = Annotated[
    float | None, typer.Option(help="Idle seconds before a session expires. (env VISTARL_SESSION_TTL_S)")
]
DataPaths = Annotated[
    list[Path] | None,
    typer.Option(
        "--data",
        help="A dataset whose splits the server also serves, as task ids SPLIT/INDEX: a directory of "
        "<split>.parquet files or one parquet file named for its split. Repeatable.",
    ),
]
LogLevel = Annotated[str | None, typer.Option(help="Log level. (env VISTARL_LOG_LEVEL)")]
EnvName = Annotated[str, typer.Argument(help="A registered env name (sokoban) or an import path.")]
