"""`vistarl rollout`: run episodes against an environment with an engine, and write the trajectories."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

if TYPE_CHECKING:
    from vistarl.trainer.rollout.trajectory import Trajectory


def rollout(
    env: Annotated[
        str,
        typer.Option(
            help="Env server URL, registered env name, env import path, or an OpenEnv server's "
            "openenv+ws://HOST:PORT?text_fields=...&image_fields=... (docs/training.md, 'OpenEnv envs')."
        ),
    ],
    engine: Annotated[
        str,
        typer.Option(help="hf:DIR (in-process transformers), hf:URL (vistarl engine serve) or sglang:URL."),
    ],
    out: Annotated[Path, typer.Option(help="Output file: one trajectory per line (JSON).")],
    episodes: Annotated[int, typer.Option(min=1, help="Episodes in all; a multiple of --group-size.")] = 8,
    group_size: Annotated[int, typer.Option(min=1, help="Samples per env seed; they share a group_id.")] = 1,
    concurrency: Annotated[int, typer.Option(min=1, help="Episodes run at once.")] = 8,
    seed: Annotated[int, typer.Option(help="Group g plays env seed S+g; sampling seeds derive from S.")] = 0,
    task_split: Annotated[
        str | None, typer.Option(help="Play the env's split instead of seeds: group g plays task SPLIT/g.")
    ] = None,
    tasks: Annotated[
        Path | None,
        typer.Option(exists=True, dir_okay=False, help="Play the rows of this parquet of samples instead."),
    ] = None,
    options: Annotated[str | None, typer.Option(help="Env options as a JSON object.")] = None,
    max_turns: Annotated[int | None, typer.Option(min=1, help="Turns per episode.")] = None,
    max_new_tokens: Annotated[int | None, typer.Option(min=1, help="Generated tokens per turn.")] = None,
    max_response_len: Annotated[int | None, typer.Option(min=1, help="Generated tokens per episode.")] = None,
    max_context_len: Annotated[int | None, typer.Option(min=1, help="Context tokens per episode.")] = None,
    temperature: Annotated[float | None, typer.Option(min=0.0, help="Sampling temperature.")] = None,
    top_p: Annotated[float | None, typer.Option(min=0.0, max=1.0, help="Nucleus sampling mass.")] = None,
    reward: Annotated[
        str | None, typer.Option(help="Reward function module[:function]; default: the env's own.")
    ] = None,
    deadline: Annotated[float | None, typer.Option(min=0.0, help="Seconds an episode may take.")] = None,
) -> None:
    """Run episodes concurrently, write each trajectory as it finishes, then print a summary."""
    from vistarl.trainer.config import RolloutConfig
    from vistarl.trainer.rollout.engines.base import EngineError
    from vistarl.trainer.rollout.engines.spec import EngineSpec
    from vistarl.trainer.rollout.rewards import load_reward_fn

    if episodes % group_size:
        raise typer.BadParameter(f"{episodes} episodes do not split into groups of {group_size}")
    overrides = {
        "max_turns": max_turns,
        "max_new_tokens": max_new_tokens,
        "rollout_max_response_len": max_response_len,
        "rollout_max_context_len": max_context_len,
        "rollout_temperature": temperature,
        "rollout_top_p": top_p,
    }
    try:
        config = RolloutConfig.model_validate({k: v for k, v in overrides.items() if v is not None})
        spec = EngineSpec.parse(engine)
        reward_fn = load_reward_fn(reward)
        env_options = _json_object(options)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    if task_split is not None and tasks is not None:
        raise typer.BadParameter("give --task-split or --tasks, not both")
    starts = _starts(episodes // group_size, seed, task_split, tasks, env_options)
    out.parent.mkdir(parents=True, exist_ok=True)

    async def main() -> tuple[list[Trajectory], float]:
        from vistarl.trainer.rollout.engines.loading import load_engine
        from vistarl.trainer.rollout.job import EpisodeSettings, group_jobs
        from vistarl.trainer.rollout.runner import RolloutRunner, run_jobs

        jobs = group_jobs(env, starts, group_size, settings=EpisodeSettings.of(config), seed=seed)
        loaded, processor = await load_engine(spec)
        runner = RolloutRunner(loaded, processor, config, reward_fn=reward_fn, deadline_s=deadline)
        done: list[Trajectory] = []
        started = time.perf_counter()
        try:
            with out.open("w", encoding="utf-8") as sink, _progress() as progress:
                bar = progress.add_task("episodes", total=len(jobs), statuses="")
                async for trajectory in run_jobs(runner, jobs, concurrency):
                    sink.write(json.dumps(trajectory.to_dict()) + "\n")
                    sink.flush()
                    done.append(trajectory)
                    counts = Counter(t.status.value for t in done)
                    progress.update(bar, advance=1, statuses=" ".join(f"{s}={n}" for s, n in counts.items()))
        finally:
            await runner.aclose()
        return done, time.perf_counter() - started

    try:
        trajectories, wall_s = asyncio.run(main())
    except (OSError, ValueError, EngineError) as exc:
        typer.echo(f"rollout failed: {exc}", err=True)
        raise typer.Exit(1) from None
    _print_summary(trajectories, wall_s, out)
    if not any(t.status.played for t in trajectories):
        typer.echo(f"every episode failed; first error: {trajectories[0].error}", err=True)
        raise typer.Exit(1)


def _starts(
    groups: int, seed: int, task_split: str | None, tasks: Path | None, options: dict[str, Any]
) -> list[dict[str, Any]]:
    """What each group plays: seeds S, S+1, ...; the tasks SPLIT/0, SPLIT/1, ...; or a parquet's rows."""
    if task_split is not None:
        return [{"task_id": f"{task_split}/{g}", "options": options} for g in range(groups)]
    if tasks is None:
        return [{"seed": seed + g, "options": options} for g in range(groups)]
    from vistarl.services.datasets import ParquetSplit

    rows = ParquetSplit(tasks)
    if len(rows) < groups:
        raise typer.BadParameter(
            f"{tasks} has {len(rows)} rows, fewer than {groups} groups", param_hint="--tasks"
        )
    return [{"sample": rows[g], "options": options} for g in range(groups)]


def _json_object(text: str | None) -> dict[str, Any]:
    """Parse `--options`: a JSON object, or nothing."""
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--options is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"--options must be a JSON object, got {type(value).__name__}")
    return value


def _progress() -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[statuses]}"),
        console=Console(stderr=True),
    )


def _print_summary(trajectories: Sequence[Trajectory], wall_s: float, out: Path) -> None:
    """Statuses, mean reward of scored episodes, turns, and generated tokens per second of episodes."""
    from vistarl.trainer.rollout.trajectory import Status

    statuses = Counter(t.status for t in trajectories)
    scored = [t.episode_reward for t in trajectories if t.status.played]
    generated = sum(t.metrics.get("generated_tokens", 0.0) for t in trajectories)
    turns = [t.metrics.get("turns", 0.0) for t in trajectories]
    table = Table(title=f"{len(trajectories)} episodes -> {out}")
    table.add_column("what")
    table.add_column("value", justify="right")
    for status in Status:
        table.add_row(status.value, str(statuses.get(status, 0)))
    table.add_row("mean reward", f"{sum(scored) / len(scored):.4f}" if scored else "-")
    table.add_row("mean turns", f"{sum(turns) / len(turns):.2f}" if turns else "-")
    table.add_row("generated tokens", f"{generated:.0f}")
    table.add_row("tokens/s", f"{generated / wall_s:.1f}")
    table.add_row("episodes wall time (s)", f"{wall_s:.2f}")
    Console().print(table)


def register(app: typer.Typer) -> None:
    """Add `rollout` to the `vistarl` command line."""
    app.command()(rollout)
