"""`vistarl model ...`: model checkpoints."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import typer

model_app = typer.Typer(help="Model checkpoints.", no_args_is_help=True)


@model_app.command("tiny")
def tiny(
    out: Path = typer.Option(..., "--out", help="Directory to write the checkpoint into."),
    arch: str = typer.Option("qwen2_5_vl", "--arch", help="qwen2_5_vl or qwen3_vl."),
    seed: int = typer.Option(0, "--seed", help="Seed of the random initialisation."),
    shape: str = typer.Option(
        "tiny", "--shape", help="Model size: tiny, small, medium or qwen2_5_vl_3b (devtools/model_shapes.py)."
    ),
) -> None:
    """Write a random-init Qwen-VL checkpoint (real tokenizer and template) for CPU runs and tests."""
    from devtools.model_shapes import ARCHS, SHAPES, Arch

    if arch not in ARCHS:
        raise typer.BadParameter(f"choose one of {', '.join(ARCHS)}", param_hint="--arch")
    if shape not in SHAPES:
        raise typer.BadParameter(f"choose one of {', '.join(SHAPES)}", param_hint="--shape")
    from devtools.tiny_checkpoint import write_tiny_checkpoint  # torch and transformers: seconds to import

    path = write_tiny_checkpoint(out, cast(Arch, arch), seed, SHAPES[shape])
    typer.echo(f"wrote {shape} {arch} checkpoint to {path}")


def register(app: typer.Typer) -> None:
    app.add_typer(model_app, name="model")
