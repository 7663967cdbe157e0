"""The `vistarl` command line: one typer app, each command group in its own module."""

from __future__ import annotations

import importlib
import sys

import typer

app = typer.Typer(
    name="vistarl",
    help="Multi-turn RL for vision-language models against HTTP environment servers.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)

GROUPS = (
    "serve", "mcp", "sokoban", "vsi", "data", "demo", "model", "engine", "rollout", "worker", "queue",
    "train", "up"
)  # fmt: skip
"""The modules of `cli` that hold the commands, in the order `vistarl --help` lists them."""
COMMANDS_ELSEWHERE = {"sft": "train", "eval": "train", "status": "up", "down": "up"}
"""The commands whose module has another name."""


@app.callback()
def _root() -> None:
    """vistarl: environment servers, rollout, queue and trainer."""


def _register(argv: list[str]) -> None:
    """Attach the command group that `argv` names, or every group (help, completion, an unknown name), so a
    command imports and builds only its own: `vistarl serve` leaves the other groups' modules (rich,
    their parameters) alone. Heavy imports (torch) stay inside the commands themselves."""
    named = next((arg for arg in argv[1:] if not arg.startswith("-")), None)
    group = COMMANDS_ELSEWHERE.get(named or "", named)
    for name in (group,) if group in GROUPS else GROUPS:
        importlib.import_module(f"vistarl.cli.{name}").register(app)


_register(sys.argv)

if __name__ == "__main__":
    app()
