"""`vistarl queue stats|dlq`: inspect a Redis episode queue and requeue its dead letters."""

from __future__ import annotations

import asyncio
import datetime
import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from vistarl.trainer.queue.base import EpisodeQueue

T = TypeVar("T")

queue_app = typer.Typer(help="Inspect and operate the episode queue.", no_args_is_help=True)

RedisUrl = Annotated[str, typer.Option(envvar="VISTARL_REDIS_URL", help="Redis holding the queue.")]
Namespace = Annotated[str, typer.Option(envvar="VISTARL_NAMESPACE", help="Queue namespace.")]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def _with_queue(redis_url: str, namespace: str, action: Callable[[EpisodeQueue], Awaitable[T]]) -> T:
    """Open the queue, run `action` on it, close it; an unreachable Redis is exit code 1, bad input 2."""
    from vistarl.trainer.queue.redis import RedisQueue

    async def run() -> T:
        async with RedisQueue(redis_url, namespace, retries=2) as queue:
            return await action(queue)

    try:
        return asyncio.run(run())
    except ConnectionError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


@queue_app.command()
def stats(redis_url: RedisUrl, namespace: Namespace = "default", as_json: AsJson = False) -> None:
    """Jobs pending, in flight, dead-lettered, results waiting, and the queue lag."""
    snapshot = _with_queue(redis_url, namespace, lambda queue: queue.stats())
    if as_json:
        typer.echo(snapshot.model_dump_json())
        return
    table = Table(title=f"queue {namespace!r}")
    table.add_column("what")
    table.add_column("count", justify="right")
    table.add_column("meaning")
    for name, field in type(snapshot).model_fields.items():
        if name != "namespace":
            value = getattr(snapshot, name)
            table.add_row(name, f"{value:.1f}" if isinstance(value, float) else str(value), field.description)
    Console().print(table)


@queue_app.command()
def dlq(
    redis_url: RedisUrl,
    ids: Annotated[
        list[str] | None, typer.Argument(help="With --requeue: `all`, or dead-letter ids.")
    ] = None,
    namespace: Namespace = "default",
    requeue: Annotated[
        bool, typer.Option("--requeue", help="Move dead letters back to the jobs, as attempt 1.")
    ] = False,
    limit: Annotated[int, typer.Option(min=1, help="Dead letters to list.")] = 100,
    as_json: AsJson = False,
) -> None:
    """List dead letters (id, episode, attempts, last error), or requeue them with --requeue all|ID..."""
    if not requeue:
        if ids:
            raise typer.BadParameter("dead-letter ids are only taken with --requeue", param_hint="IDS")
        letters = _with_queue(redis_url, namespace, lambda queue: queue.dead_letters(limit))
        if as_json:
            typer.echo(json.dumps([letter.model_dump() for letter in letters]))
            return
        table = Table(title=f"dead letters of {namespace!r}")
        for column in ("id", "episode", "attempts", "failed at", "last error"):
            table.add_column(column)
        for letter in letters:
            failed_at = datetime.datetime.fromtimestamp(letter.failed_at).isoformat(timespec="seconds")
            table.add_row(letter.id, str(letter.episode_id), str(letter.attempts), failed_at, letter.error)
        Console().print(table)
        return
    if not ids:
        raise typer.BadParameter("--requeue needs `all` or dead-letter ids", param_hint="IDS")
    wanted = None if ids == ["all"] else ids
    moved = _with_queue(redis_url, namespace, lambda queue: queue.requeue_dead(wanted))
    typer.echo(json.dumps({"requeued": moved}) if as_json else f"requeued {len(moved)} dead letters")
    missing = sorted(set(wanted or []) - set(moved))
    if missing:
        typer.echo(
            f"not requeued (unknown id, or a job that cannot be decoded): {' '.join(missing)}", err=True
        )
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add the `queue` command group to the `vistarl` command line."""
    app.add_typer(queue_app, name="queue")
