"""`vistarl data ...`: build data sets: `sokoban` writes the Sokoban parquet splits, `geo3k` converts the
real Geometry3K (its original folders, or parquet) into Geo3k samples, `vsi` imports VSI-Bench's
questions."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import Progress

data_app = typer.Typer(help="Build data sets.", no_args_is_help=True)


@contextlib.contextmanager
def _exit_on(console: Console, error: type[Exception]) -> Iterator[None]:
    """Report `error`, the data builder's own failure (bad input, a missing file), as one red line and
    exit with status 1, without a traceback."""
    try:
        yield
    except error as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from None


@data_app.command("sokoban")
def sokoban_command(
    out: Annotated[Path, typer.Option("--out", help="Directory for train.parquet and test.parquet.")],
    n_train: Annotated[int, typer.Option("--n-train", min=0, help="Training levels.")] = 1000,
    n_test: Annotated[int, typer.Option("--n-test", min=0, help="Test levels.")] = 100,
    seed: Annotated[
        int, typer.Option("--seed", min=0, help="Base seed (train seeds even, test seeds odd).")
    ] = 0,
    grid_size: Annotated[int, typer.Option("--grid-size", help="Grid side, border walls included.")] = 6,
    num_boxes: Annotated[int, typer.Option("--num-boxes", help="Boxes per level.")] = 1,
    wall_fraction: Annotated[
        float, typer.Option("--wall-fraction", help="Chance of an interior wall.")
    ] = 0.05,
    min_moves: Annotated[int, typer.Option("--min-moves", help="Shortest optimal solution allowed.")] = 1,
    max_moves: Annotated[
        int | None, typer.Option("--max-moves", help="Longest optimal solution allowed.")
    ] = None,
    render_mode: Annotated[str, typer.Option("--render-mode", help="vision, text or both.")] = "vision",
    max_steps: Annotated[int, typer.Option("--max-steps", help="Primitive moves per episode.")] = 100,
) -> None:
    """Generate solvable Sokoban levels and write them in the seed's processed parquet schema."""
    from pydantic import ValidationError

    from vistarl.services.sokoban.dataset import DatasetError, write_dataset
    from vistarl.services.sokoban.options import SokobanOptions

    try:
        options = SokobanOptions.model_validate(
            {
                "grid_size": grid_size,
                "num_boxes": num_boxes,
                "wall_fraction": wall_fraction,
                "min_solution_len": min_moves,
                "max_solution_len": max_moves,
                "render_mode": render_mode,
                "max_steps": max_steps,
            }
        )
    except ValidationError as exc:
        raise typer.BadParameter(str(exc)) from None
    console = Console()
    with Progress(console=console, transient=True) as progress, _exit_on(console, DatasetError):
        task = progress.add_task("generating levels", total=n_train + n_test)
        paths = write_dataset(out, n_train, n_test, seed, options, lambda: progress.advance(task))
    console.print(f"wrote {n_train} rows to {paths['train']} and {n_test} rows to {paths['test']}")


@data_app.command("vsi")
def vsi_command(
    source: Annotated[
        Path, typer.Option("--from", exists=True, dir_okay=False, help="VSI-Bench's parquet file.")
    ],
    out: Annotated[Path, typer.Option("--out", help="Directory for test.parquet.")],
) -> None:
    """Import VSI-Bench's questions (id, dataset, scene_name, question_type, question, ground_truth, options)
    as the VSI test split; each row's scene must be one of the 288 vendored layouts."""
    from vistarl.services.vsi.dataset import DatasetError, import_vsibench

    console = Console()
    with _exit_on(console, DatasetError):
        path, rows = import_vsibench(source, out)
    console.print(f"wrote {rows} questions to {path}")


@data_app.command("geo3k")
def geo3k_command(
    source: Annotated[
        Path,
        typer.Option(
            "--from",
            exists=True,
            help="The real Geometry3K: the original folders (SPLIT/ID/data.json + img_diagram.png, as "
            "the Inter-GPS release ships them), or parquet: a file, or a directory of them "
            "(hiyouga/geometry3k, or the seed's geo3k_imgurl_processed).",
        ),
    ],
    out: Annotated[
        Path, typer.Option("--out", help="Directory for <split>.parquet in the Geo3k sample schema.")
    ],
) -> None:
    """Convert the real Geometry3K (folders or parquet) into Geo3k samples, one parquet per split."""
    from vistarl.services.geo3k.geometry3k import ConversionError, convert, count_rows, source_files

    console = Console()
    with _exit_on(console, ConversionError):
        total = count_rows(source_files(source))
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task("converting rows", total=total)
            reports = convert(source, out, lambda rows: progress.advance(task, rows))
    for split, report in reports.items():
        dropped = f", instruction block dropped from {report.instructions_dropped}"
        console.print(
            f"{split}: wrote {report.rows} rows to {report.path}"
            + (dropped if report.instructions_dropped else "")
            + (f", skipped {len(report.skipped)}" if report.skipped else "")
        )
        for reason in report.skipped[:5]:
            console.print(f"  skipped {reason}")


def register(app: typer.Typer) -> None:
    """Attach `vistarl data ...`."""
    app.add_typer(data_app, name="data")
