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

    from vistarl.cli.sokoban import write_demonstrations, write_transcriptions
    from vistarl.services.sokoban.demos import TRANSCRIBE_FIRST_SEED
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
    data = demos_from or root / "demos.jsonl"
    if demos_from is None:
        write_demonstrations(options, _training_seeds(demos, cfg.env.eval_seed_range), data)
        console.print(f"wrote {demos} solver demonstrations to {data}")
    sft: dict[str, Any] = {"data": data}
    boards = range(TRANSCRIBE_FIRST_SEED, TRANSCRIBE_FIRST_SEED + cfg.sft.transcribe_boards)
    held_out = cfg.env.eval_seed_range
    if boards and max(boards.start, held_out.start) < min(boards.stop, held_out.stop):
        raise typer.BadParameter(f"the boards to read ({boards}) overlap env.eval_seeds", param_hint="--set")
    if cfg.sft.transcribe_boards:
        sft["transcribe_data"] = root / "boards.jsonl"
        write_transcriptions(options, cfg.sft.transcribe_boards, sft["transcribe_data"])
        console.print(f"wrote {cfg.sft.transcribe_boards} boards to read to {sft['transcribe_data']}")
    cfg = cfg.model_copy(update={"sft": cfg.sft.model_copy(update=sft)})
    result = asyncio.run(run_curriculum(cfg, root, console))
    console.print(f"runs, curves and saved episodes under {root}")
    console.print(result.headline(), markup=False)


def _training_seeds(count: int, eval_seeds: range) -> list[int]:
    """The first `count` level seeds outside the held-out range."""
    return [seed for seed in range(count + len(eval_seeds)) if seed not in eval_seeds][:count]


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
    from vistarl.serving.launch import serve_env

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
