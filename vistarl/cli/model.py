"""`vistarl model ...`: model checkpoints."""

from __future__ import annotations

from pathlib import Path

import typer

model_app = typer.Typer(help="Model checkpoints.", no_args_is_help=True)

DTYPES = ("float32", "bfloat16")


@model_app.command("tiny")
def tiny(
    out: Path = typer.Option(..., "--out", help="Directory to write the checkpoint into."),
    arch: str | None = typer.Option(
        None, "--arch", help="qwen2_5_vl or qwen3_vl; a released model's shape implies its own."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the random initialisation."),
    shape: str = typer.Option(
        "tiny",
        "--shape",
        help="Model size: tiny, small, medium, or a released model's (qwen2_5_vl_3b, qwen3_vl_2b), "
        "vistarl/devtools/model_shapes.py.",
    ),
    dtype: str | None = typer.Option(
        None, "--dtype", help="float32 or bfloat16; released shapes default to bfloat16, as they ship."
    ),
    device: str = typer.Option(
        "cpu", "--device", help="Where to initialise the weights: cpu, or cuda (seconds at 2-3B)."
    ),
) -> None:
    """Write a random-init Qwen-VL checkpoint (real tokenizer and template) for CPU runs, tests and GPU
    benchmarks of the released shapes."""
    from vistarl.devtools.model_shapes import REAL_SHAPES, SHAPES, arch_for

    try:
        chosen = arch_for(shape, arch)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--shape/--arch") from None
    if dtype is not None and dtype not in DTYPES:
        raise typer.BadParameter(f"choose one of {', '.join(DTYPES)}", param_hint="--dtype")
    import torch  # here: the checks above answer without importing torch

    from vistarl.devtools.tiny_checkpoint import write_tiny_checkpoint

    weights = getattr(torch, dtype or ("bfloat16" if shape in REAL_SHAPES else "float32"))
    path = write_tiny_checkpoint(out, chosen, seed, SHAPES[shape], dtype=weights, device=device)
    typer.echo(f"wrote {shape} {chosen} checkpoint ({dtype or weights}) to {path}")


def register(app: typer.Typer) -> None:
    app.add_typer(model_app, name="model")
