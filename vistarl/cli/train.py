"""`vistarl train` (the RL loop), `vistarl sft` (supervised fine-tuning) and `vistarl eval` (greedy
evaluation of a checkpoint)."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from vistarl.trainer.config import TrainConfig

ConfigOption = Annotated[
    Path, typer.Option("--config", exists=True, dir_okay=False, help="YAML config (see configs/).")
]
OptionalConfig = Annotated[
    Path | None,
    typer.Option("--config", exists=True, dir_okay=False, help="YAML config (default: all defaults)."),
]
SetOption = Annotated[
    list[str] | None, typer.Option("--set", help="Override a config key: section.key=value; repeatable.")
]


def _load(config: Path | None, overrides: list[str] | None) -> TrainConfig:
    """The validated config; a bad file or override is a usage error naming the key."""
    from vistarl.trainer.config import ConfigError, load_config

    try:
        return load_config(config, overrides or [])
    except ConfigError as exc:
        raise typer.BadParameter(str(exc), param_hint="--config/--set") from None


def _quiet_logs() -> None:
    """Warnings and errors only: the console shows the run's own progress."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def train(
    config: ConfigOption,
    set_: SetOption = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue from the run directory's latest checkpoint.")
    ] = False,
) -> None:
    """Train a policy as the config says; with no URLs in it, the whole stack runs on this machine. SIGTERM
    stops it between steps with a checkpoint of the last one (exit 143); `--resume` continues it."""
    from vistarl.trainer.run.directory import run_name
    from vistarl.trainer.run.train import run_training

    cfg = _load(config, set_)
    _quiet_logs()
    console = Console()
    name = run_name(config, cfg.env.name)
    try:
        result = asyncio.run(run_training(cfg, name=name, resume=resume, console=console))
    except (FileExistsError, RuntimeError, TimeoutError, OSError, ValueError) as exc:
        console.print(f"[red]training failed:[/red] {exc}")
        raise typer.Exit(1) from None
    if result.stopped:
        console.print(f"stopped after step {result.steps} (SIGTERM); checkpoint: {result.checkpoint}")
        console.print("`--resume` with the same run directory continues the run")
        raise typer.Exit(128 + signal.SIGTERM)
    if result.history:
        console.print(f"finished {result.steps} steps; metrics, reward curve and samples in {result.run_dir}")
        console.print(f"checkpoint: {result.checkpoint}")


def sft(config: ConfigOption, set_: SetOption = None) -> None:
    """Supervised fine-tuning on `sft.data` (demonstrations or trajectories), through the RL learner."""
    from vistarl.trainer.run.directory import run_name
    from vistarl.trainer.sft import run_sft

    cfg = _load(config, set_)
    _quiet_logs()
    console = Console()
    try:
        result = run_sft(cfg, name=f"{run_name(config, cfg.env.name)}-sft", console=console)
    except (FileExistsError, RuntimeError, OSError, ValueError) as exc:
        console.print(f"[red]SFT failed:[/red] {exc}")
        raise typer.Exit(1) from None
    if result.history:
        console.print(f"finished {result.steps} SFT steps; metrics and loss curve in {result.run_dir}")
        console.print(f"policy checkpoint (use as model.path): {result.model_dir}")


def eval_command(
    config: OptionalConfig = None,
    set_: SetOption = None,
    env: Annotated[
        str | None, typer.Option("--env", help="The env to evaluate (env.name): sokoban, geo3k, vsi, ...")
    ] = None,
    checkpoint: Annotated[
        Path | None,
        typer.Option(exists=True, file_okay=False, help="HF checkpoint directory (default: model.path)."),
    ] = None,
    dummy: Annotated[
        bool, typer.Option("--dummy", help="Play the env's random player instead of a model.")
    ] = False,
    max_episodes: Annotated[
        int | None,
        typer.Option(
            "--max-episodes", "--max-questions", min=1, help="Play only the first N held-out tasks."
        ),
    ] = None,
    out: Annotated[
        Path | None, typer.Option("--out", help="Run directory (default runs/eval-<config>-<time>).")
    ] = None,
) -> None:
    """Evaluate greedily on the held-out tasks (env.eval_split, else env.eval_seeds); save every episode's
    images and trajectory JSON; print the summary and the env's benchmark scores."""
    from vistarl.services.env_api import load_env_factory
    from vistarl.trainer.eval import baseline_policy, evaluate
    from vistarl.trainer.rollout.engines.scripted import ScriptedEngine
    from vistarl.trainer.rollout.processor import VLProcessor
    from vistarl.trainer.run.directory import run_name
    from vistarl.trainer.run.stack import open_stack

    cfg = _load(config, [*([f"env.name={env}"] if env else []), *(set_ or [])])
    _quiet_logs()
    model_path = checkpoint or Path(cfg.model.path)
    name = run_name(config, cfg.env.name)
    run_dir = out or Path("runs") / f"eval-{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    console = Console()
    random_reply = load_env_factory(cfg.env.name).random_reply if dummy else None
    if dummy and random_reply is None:
        raise typer.BadParameter(f"env {cfg.env.name!r} has no random player", param_hint="--dummy")
    if dummy and checkpoint is None and not model_path.is_dir():
        model_path = _player_processor(cfg, run_dir)
        console.print(f"no checkpoint at {cfg.model.path}: the random player tokenizes with {model_path}")
    if not dummy:
        _check_arch(cfg, model_path)

    async def main() -> dict[str, float]:
        processor = await asyncio.to_thread(VLProcessor.from_pretrained, model_path)
        engine = ScriptedEngine(processor, baseline_policy(random_reply, processor)) if random_reply else None
        async with open_stack(cfg, processor, model_path, run_dir, engine=engine) as stack:
            return await evaluate(
                stack, cfg, version=0, key="eval", out_dir=run_dir, max_episodes=max_episodes
            )

    try:
        summary = asyncio.run(main())
    except (RuntimeError, TimeoutError, OSError, ValueError) as exc:
        console.print(f"[red]evaluation failed:[/red] {exc}")
        raise typer.Exit(1) from None
    held_out = cfg.env.eval_split or f"seeds {cfg.env.eval_seeds}"
    table = Table(title=f"{'random player' if dummy else model_path} on {cfg.env.name} {held_out}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for metric, value in summary.items():
        table.add_row(metric.removeprefix("eval/"), f"{value:.4g}")
    console.print(table)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    console.print(f"images, trajectories and summary.json saved under {run_dir}")


def _check_arch(cfg: TrainConfig, checkpoint: Path) -> None:
    """A usage error unless `checkpoint` is of the config's `model.arch`."""
    from vistarl.trainer.config import ConfigError

    try:
        cfg.model.check_arch(checkpoint)
    except ConfigError as exc:
        raise typer.BadParameter(str(exc), param_hint="--checkpoint/--set model.arch") from None


def _player_processor(cfg: TrainConfig, run_dir: Path) -> Path:
    """What the random player needs of a checkpoint, as it has no weights: Qwen's tokenizer and image
    processor (of `model.arch`; Qwen2.5-VL's for auto), written under the run directory."""
    from vistarl.devtools.tiny_checkpoint import write_processor

    arch = "qwen2_5_vl" if cfg.model.arch == "auto" else cfg.model.arch
    return write_processor(run_dir / "processor", arch)


def register(app: typer.Typer) -> None:
    """Add `train`, `sft` and `eval` to the `vistarl` command line."""
    app.command("train")(train)
    app.command("sft")(sft)
    app.command("eval")(eval_command)
