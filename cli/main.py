"""The `vistarl` command line: one typer app, each command group in its own module."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="vistarl",
    help="Multi-turn RL for vision-language models against HTTP environment servers.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)


@app.callback()
def _root() -> None:
    """vistarl: environment servers, rollout, queue and trainer."""


def _register() -> None:
    """Attach every command group. Heavy imports (torch) stay inside the commands themselves."""
    from cli import data, demo, engine, mcp, model, queue, rollout, serve, sokoban, train, vsi, worker

    for group in (serve, mcp, sokoban, vsi, data, demo, model, engine, rollout, worker, queue, train):
        group.register(app)


_register()

if __name__ == "__main__":
    app()
