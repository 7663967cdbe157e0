"""`vistarl demo learn`: a policy learns Sokoban on this machine, SFT on the solver's demonstrations then
GRPO, with held-out success measured before, between and after (`make demo` runs it).

`vistarl demo solver`: a scripted agent plays Sokoban against a real server, over HTTP, end to end.

The command starts `vistarl serve sokoban` on a free port, lets an agent that knows the BFS solution send
it as `<answer>..</answer>` turns of up to three moves through the Python client, prints each episode's
result, and saves every turn's image (PNG) and a trajectory JSON per episode under the run directory.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from vistarl.clients.http import EnvClient
    from vistarl.services.sokoban.options import SokobanOptions
    from vistarl.trainer.config import TrainConfig

demo_app = typer.Typer(help="End-to-end demonstrations that run on this machine; with no command, `solver`.")

TABLE_COLUMNS = (
    "episode",
    "seed",
    "optimal moves",
    "turns",
    "sum of turn rewards",
    "episode reward",
    "solved",
)


@dataclass(frozen=True)
class EpisodeResult:
    """What one demo episode came to."""

    seed: int
    optimal_moves: int
    turns: int
    total_reward: float
    episode_reward: float | None
    success: bool


@demo_app.callback(invoke_without_command=True)
def _default(ctx: typer.Context) -> None:
    """Run `solver` with its defaults when no command is given."""
    if ctx.invoked_subcommand is None:
        solver_command()


@demo_app.command("learn")
def learn_command(
    config: Annotated[
        Path,
        typer.Option(
            "--config", exists=True, dir_okay=False, help="YAML config (configs/sokoban_demo.yaml)."
        ),
    ],
    demos: Annotated[int, typer.Option("--demos", min=1, help="Solver demonstrations to imitate.")] = 600,
    demos_from: Annotated[
        Path | None,
        typer.Option(
            "--demos-from", exists=True, dir_okay=False, help="Imitate this JSONL (`vistarl sokoban demos`)."
        ),
    ] = None,
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="Override a config key: section.key=value; repeatable.")
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option("--out", file_okay=False, help="Run directory (default runs/demo-<time>)."),
    ] = None,
) -> None:
    """SFT on solver demonstrations (after a reading stage with `sft.transcribe_boards`), then GRPO; prints
    held-out success before, after SFT and after RL."""
    import asyncio

    from vistarl.services.sokoban.options import SokobanOptions
    from vistarl.trainer.config import ConfigError, load_config
    from vistarl.trainer.curriculum import run_curriculum

    try:
        cfg = load_config(config, set_ or [])
        options = SokobanOptions.model_validate(cfg.env.options)
    except (ConfigError, ValueError) as exc:
        raise typer.BadParameter(str(exc), param_hint="--config/--set") from None
    root = out or Path("runs") / f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    root.mkdir(parents=True, exist_ok=True)
    console = Console()
    try:
        cfg = write_sft_data(cfg, options, demos, demos_from, root, console)
    except ValueError as exc:  # a --demos-from file that names no levels, or too few levels to train on
        raise typer.BadParameter(str(exc), param_hint="--demos-from/--set") from None
    result = asyncio.run(run_curriculum(cfg, root, console))
    console.print(f"runs, curves and saved episodes under {root}")
    console.print(result.headline(), markup=False)


def write_sft_data(
    cfg: TrainConfig,
    options: SokobanOptions,
    demos: int,
    demos_from: Path | None,
    root: Path,
    console: Console,
) -> TrainConfig:
    """Write what SFT imitates under `root`: `demos` solver demonstrations of GRPO's first levels (unless
    `demos_from` gives them) and `sft.transcribe_boards` boards to read, none of a held-out level; print
    how many held-out levels the SFT data holds (0 unless `demos_from` brings some). Returns `cfg` with
    `sft.data` (and `sft.transcribe_data`) set."""
    from vistarl.cli.sokoban import recorded_levels, write_demonstrations, write_transcriptions
    from vistarl.trainer.run.prompts import PromptSource

    training = PromptSource(cfg)  # seeds past the held-out ones, and past every held-out level
    data = demos_from or root / "demos.jsonl"
    if demos_from is None:
        write_demonstrations(options, [start["seed"] for start in training.take(0, demos)], data)
        console.print(f"wrote {demos} solver demonstrations to {data}")
    sft: dict[str, Any] = {"data": data}
    if cfg.sft.transcribe_boards:
        sft["transcribe_data"] = root / "boards.jsonl"
        write_transcriptions(
            options,
            cfg.sft.transcribe_boards,
            sft["transcribe_data"],
            training.held_out_tasks,
            cfg.sft.transcribe_system_prompt,
        )
        console.print(f"wrote {cfg.sft.transcribe_boards} boards to read to {sft['transcribe_data']}")
    shown = set().union(*(recorded_levels(path) for path in (data, sft.get("transcribe_data")) if path))
    held_out = training.held_out_tasks
    seeds = sum(len(seeds) for seeds in training.held_out)
    console.print(
        f"held-out levels in the SFT data: {len(held_out & shown)} of {len(held_out)} (the distinct levels "
        f"of {seeds} held-out seeds); GRPO plays none of them",
        markup=False,
        soft_wrap=True,
    )
    return cfg.model_copy(update={"sft": cfg.sft.model_copy(update=sft)})


@demo_app.command("solver")
def solver_command(
    levels: Annotated[int, typer.Option("--levels", min=1, max=100, help="Levels to play.")] = 5,
    out: Annotated[
        Path | None, typer.Option("--out", help="Run directory (default runs/demo-solver-<time>).")
    ] = None,
    port: Annotated[int | None, typer.Option("--port", help="Server port (default: a free one).")] = None,
    seed: Annotated[int, typer.Option("--seed", min=0, help="Seed of the first level; the next add 1.")] = 0,
) -> None:
    """Serve Sokoban, play generated levels with a scripted BFS agent over HTTP, and save what it saw."""
    from vistarl.clients.errors import EnvClientError
    from vistarl.clients.http import EnvClient
    from vistarl.httpserver.launch import serve_env

    run_dir = out or Path("runs") / f"demo-solver-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir.mkdir(parents=True, exist_ok=True)
    console = Console()
    console.print(f"starting vistarl serve sokoban (log: {run_dir / 'server.log'})")
    try:
        with serve_env("sokoban", run_dir / "server.log", port) as url, EnvClient(url) as client:
            results = [_play(client, seed + i, run_dir / f"episode-{i:02d}") for i in range(levels)]
    except (EnvClientError, RuntimeError, TimeoutError) as exc:
        console.print(f"[red]demo failed:[/red] {exc}")
        raise typer.Exit(1) from None
    console.print(_table(results))
    console.print(f"images and trajectories saved under {run_dir}")
    if not all(r.success for r in results):
        raise typer.Exit(1)


def _play(client: EnvClient, seed: int, out_dir: Path) -> EpisodeResult:
    """Play one level: solve the level the server sent, send the moves in turns, save images and JSON."""
    from vistarl.services.sokoban.game import Level
    from vistarl.services.sokoban.options import SokobanOptions
    from vistarl.services.sokoban.solver import solve

    out_dir.mkdir(parents=True, exist_ok=True)
    per_turn = SokobanOptions().max_actions_per_turn
    with client.episode(seed=seed) as episode:
        level = Level.from_xsb(episode.info["level"])
        solution = solve(level)
        if solution.moves is None:
            raise RuntimeError(f"seed {seed}: the solver found no solution ({solution.status})")
        turns: list[dict[str, Any]] = [
            {"turn": 0, "images": _save_images(episode.observation.images, out_dir, 0), "info": episode.info}
        ]
        moves = list(solution.moves)
        for turn, start in enumerate(range(0, len(moves), per_turn), start=1):
            action = _answer(moves[start : start + per_turn])
            result = episode.step(action)
            turns.append(
                {
                    "turn": turn,
                    "action": action,
                    "reward": result.reward,
                    "done": result.done,
                    "observation_text": result.observation.text,
                    "images": _save_images(result.observation.images, out_dir, turn),
                    "info": result.info,
                }
            )
            if result.done:
                break
        final = episode.info
        outcome = EpisodeResult(
            seed=seed,
            optimal_moves=len(moves),
            turns=episode.turns,
            total_reward=episode.total_reward,
            episode_reward=final.get("episode_reward"),
            success=bool(final.get("success")),
        )
    trajectory = {"result": asdict(outcome), "level": level.to_xsb(), "solution": moves, "turns": turns}
    (out_dir / "trajectory.json").write_text(json.dumps(trajectory, indent=2))
    return outcome


def _answer(moves: list[str]) -> str:
    """The scripted agent's response for one turn, e.g. `<answer>Up, Left</answer>`."""
    return "<answer>" + ", ".join(move.capitalize() for move in moves) + "</answer>"


def _save_images(urls: list[str], out_dir: Path, turn: int) -> list[str]:
    """Write a turn's images as PNG files; return their names."""
    from vistarl.clients.images import decode_image

    names = []
    for index, url in enumerate(urls):
        name = f"turn-{turn:02d}-{index}.png"
        decode_image(url).save(out_dir / name)
        names.append(name)
    return names


def _table(results: list[EpisodeResult]) -> Table:
    table = Table(title="Scripted solver on Sokoban over HTTP")
    for column in TABLE_COLUMNS:
        table.add_column(column, justify="right")
    for i, r in enumerate(results):
        episode_reward = "-" if r.episode_reward is None else f"{r.episode_reward:.2f}"
        solved = "[green]yes[/green]" if r.success else "[red]no[/red]"
        table.add_row(
            str(i),
            str(r.seed),
            str(r.optimal_moves),
            str(r.turns),
            f"{r.total_reward:.2f}",
            episode_reward,
            solved,
        )
    return table


def register(app: typer.Typer) -> None:
    """Attach `vistarl demo ...`."""
    app.add_typer(demo_app, name="demo")
