"""`vistarl sokoban solve`: how many vendored Boxoban levels the solver finishes within a time budget;
`vistarl sokoban demos`: the solver's solutions as expert conversations for `vistarl sft`."""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable, Set
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

if TYPE_CHECKING:
    from vistarl.services.sokoban.demos import SystemPrompt
    from vistarl.services.sokoban.options import SokobanOptions

sokoban_app = typer.Typer(
    help="Sokoban tools: the solver over the vendored Boxoban levels, expert demonstrations.",
    no_args_is_help=True,
)


@dataclass
class FileReport:
    """The solver's tally on one Boxoban file."""

    file: str
    levels: int
    attempted: int = 0
    solved: int = 0
    seconds: list[float] = field(default_factory=list)
    moves: list[int] = field(default_factory=list)
    elapsed: float = 0.0


@sokoban_app.command("solve")
def solve_command(
    file: Annotated[
        list[str] | None, typer.Option("--file", help="Boxoban file (repeatable); all three if omitted.")
    ] = None,
    limit: Annotated[
        int | None, typer.Option("--limit", min=1, help="Only the first N levels of each file.")
    ] = None,
    time_budget: Annotated[
        float, typer.Option("--time-budget", min=0.1, help="Seconds per file, in all.")
    ] = 120.0,
    per_level: Annotated[
        float, typer.Option("--per-level", min=0.01, help="Seconds per level at most.")
    ] = 10.0,
) -> None:
    """Run the solver over Boxoban levels within a time budget and print the solve rate of each file.

    A level counts as solved only when replaying the solution's moves solves it; levels not reached
    before the budget runs out count as unsolved.
    """
    from vistarl.services.sokoban.boxoban import BOXOBAN_FILES, boxoban_file_name

    try:
        files = [boxoban_file_name(name) for name in file] if file else list(BOXOBAN_FILES)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--file") from None
    console = Console()
    reports = [_solve_file(name, limit, time_budget, per_level, console) for name in files]
    console.print(_summary(reports, time_budget, per_level))


def _solve_file(
    name: str, limit: int | None, budget: float, per_level: float, console: Console
) -> FileReport:
    """Solve the levels of one file in order until they or the budget run out."""
    from vistarl.services.sokoban.boxoban import boxoban_levels
    from vistarl.services.sokoban.game import Game
    from vistarl.services.sokoban.solver import solve

    levels = boxoban_levels(name)[:limit]
    report = FileReport(name, len(levels))
    start = time.monotonic()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task(f"{name}: 0 solved", total=len(levels))
        for level in levels:
            remaining = budget - (time.monotonic() - start)
            if remaining <= 0:
                break
            began = time.monotonic()
            result = solve(level, time_limit=min(per_level, remaining))
            report.attempted += 1
            if result.moves is not None and Game(level).play(result.moves):
                report.solved += 1
                report.seconds.append(time.monotonic() - began)
                report.moves.append(len(result.moves))
            progress.update(task, advance=1, description=f"{name}: {report.solved} solved")
    report.elapsed = time.monotonic() - start
    return report


def _summary(reports: list[FileReport], budget: float, per_level: float) -> Table:
    """One row per file: levels, attempted, solved, solve rate, and the solved levels' time and length."""
    table = Table(title=f"Boxoban solve rate (budget {budget:g} s per file, {per_level:g} s per level)")
    for column in ("file", "levels", "attempted", "solved", "rate", "median s", "mean moves", "elapsed s"):
        table.add_column(column, justify="left" if column == "file" else "right")
    for r in reports:
        table.add_row(
            r.file,
            str(r.levels),
            str(r.attempted),
            str(r.solved),
            f"{r.solved / r.levels:.1%}" if r.levels else "-",
            f"{statistics.median(r.seconds):.2f}" if r.seconds else "-",
            f"{statistics.fmean(r.moves):.0f}" if r.moves else "-",
            f"{r.elapsed:.1f}",
        )
    return table


@sokoban_app.command("demos")
def demos_command(
    n: Annotated[int, typer.Option("--n", min=1, help="Demonstrations (levels) to write.")],
    out: Annotated[Path, typer.Option("--out", help="JSONL file: one conversation per line.")],
    first_seed: Annotated[
        int,
        typer.Option(
            "--first-seed", min=0, help="Play levels first_seed .. first_seed+n-1 (keep off eval seeds)."
        ),
    ] = 0,
    options: Annotated[
        str | None, typer.Option("--options", help="Env options as JSON, e.g. '{\"cell_size\": 28}'.")
    ] = None,
) -> None:
    """Write solved levels as chat conversations, rendered as the env renders them, for `vistarl sft`."""
    import json

    from pydantic import ValidationError

    from vistarl.services.sokoban.options import SokobanOptions

    try:
        env_options = SokobanOptions.model_validate(json.loads(options) if options else {})
    except (ValueError, ValidationError) as exc:
        raise typer.BadParameter(str(exc), param_hint="--options") from None
    out.parent.mkdir(parents=True, exist_ok=True)
    columns = (TextColumn("demonstrations"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, transient=True) as progress:
        turns = write_demonstrations(env_options, progress.track(range(first_seed, first_seed + n)), out)
    typer.echo(f"wrote {n} demonstrations ({statistics.fmean(turns):.1f} turns each) to {out}")


def write_demonstrations(options: SokobanOptions, seeds: Iterable[int], out: Path) -> list[int]:
    """Write the solved levels `seeds` to `out` as JSONL conversations (images as data URLs), the form
    `vistarl sft` reads; returns each one's number of turns."""
    from vistarl.services.sokoban.demos import demonstration

    return write_conversations((demonstration(options, seed) for seed in seeds), out)


def write_transcriptions(
    options: SokobanOptions,
    count: int,
    out: Path,
    held_out: Set[str] = frozenset(),
    system_prompt: SystemPrompt = True,
) -> list[int]:
    """Write `count` boards to read (`transcriptions`, none of a level whose key is in `held_out`, with or
    without the env's system prompt, or alternately) to `out` as JSONL conversations, for SFT's reading stage
    (`sft.transcribe_data`); returns their turns (1 each)."""
    from vistarl.services.sokoban.demos import transcriptions

    return write_conversations(transcriptions(options, count, held_out, system_prompt), out)


def recorded_levels(path: Path) -> set[str]:
    """The keys of the levels that the conversations of a JSONL file show or come from (the `levels`
    that `demonstration` and `transcription` write); a record without them is a ValueError naming it."""
    import json

    keys: set[str] = set()
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            levels = json.loads(line).get("levels") if line.strip() else []
            if not isinstance(levels, list):
                raise ValueError(
                    f"{path} line {number} names no levels: write it again with `vistarl sokoban demos`"
                )
            keys.update(levels)
    return keys


def write_conversations(records: Iterable[dict[str, Any]], out: Path) -> list[int]:
    """Write conversation records (messages holding PIL images) to `out` as JSONL, images as data URLs;
    returns each one's number of assistant replies."""
    import json

    from vistarl.services.server.encoding import message_to_wire

    turns = []
    with out.open("w", encoding="utf-8") as sink:
        for record in records:
            record["messages"] = [message_to_wire(m).model_dump(mode="json") for m in record["messages"]]
            sink.write(json.dumps(record) + "\n")
            turns.append(sum(m["role"] == "assistant" for m in record["messages"]))
    return turns


def register(app: typer.Typer) -> None:
    """Attach `vistarl sokoban ...`."""
    app.add_typer(sokoban_app, name="sokoban")
