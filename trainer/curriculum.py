"""Imitation, then reinforcement: SFT on `sft.data`, then RL from the SFT checkpoint, with the same
held-out evaluation before, between and after.

`run_curriculum(cfg, root)`:

1. evaluates `model.path` greedily on the held-out tasks (`vistarl.trainer.eval`: `env.eval_split`, else
   `env.eval_seeds`, which training never plays);
2. fine-tunes it on `sft.data` (`vistarl.trainer.sft`), and evaluates the result;
3. trains it with the configured RL algorithm (`vistarl.trainer.run.train`), and evaluates the result.

Each stage has its own directory under `root` (`eval-before/`, `sft/`, `eval-sft/`, `rl/`, `eval-rl/`)
with its metrics, curves and saved episodes; `rl/reward_curve.png` shows reward and success per RL step.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from vistarl.trainer.config import TrainConfig
from vistarl.trainer.eval import evaluate
from vistarl.trainer.learner.checkpoint import latest_checkpoint
from vistarl.trainer.rollout.processor import VLProcessor
from vistarl.trainer.run.stack import open_stack
from vistarl.trainer.run.train import run_training
from vistarl.trainer.sft import run_sft

__all__ = ["CurriculumResult", "evaluate_checkpoint", "run_curriculum"]


@dataclass(frozen=True)
class CurriculumResult:
    """Held-out success (a fraction) of the model before SFT, after SFT and after RL, over `tasks` tasks."""

    before: float
    after_sft: float
    after_rl: float
    tasks: int
    root: Path

    def headline(self) -> str:
        """The one line that sums the run up."""
        return (
            f"held-out success: before {self.before:.0%} -> after SFT {self.after_sft:.0%} -> "
            f"after RL {self.after_rl:.0%} ({self.tasks} levels)"
        )


async def evaluate_checkpoint(cfg: TrainConfig, model_path: Path, out_dir: Path) -> dict[str, float]:
    """Greedy held-out evaluation of the checkpoint at `model_path`, its episodes saved under `out_dir`."""
    processor = await asyncio.to_thread(VLProcessor.from_pretrained, model_path)
    async with open_stack(cfg, processor, model_path, out_dir) as stack:
        return await evaluate(stack, cfg, version=0, key="eval", out_dir=out_dir)


async def run_curriculum(cfg: TrainConfig, root: Path, console: Console | None = None) -> CurriculumResult:
    """Evaluate, SFT, evaluate, RL, evaluate (see the module docstring)."""
    console = console or Console()
    base = Path(cfg.model.path)
    before = await _evaluated(cfg, base, root / "eval-before", "before SFT", console)
    sft_cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"run_dir": root / "sft"})})
    sft = run_sft(sft_cfg, name="sft", console=console)
    after_sft = await _evaluated(cfg, sft.model_dir, root / "eval-sft", "after SFT", console)
    rl_cfg = cfg.model_copy(
        update={
            "model": cfg.model.model_copy(update={"path": str(sft.model_dir)}),
            "train": cfg.train.model_copy(update={"run_dir": root / "rl"}),
        }
    )
    trained = await run_training(rl_cfg, name="rl", console=console)
    checkpoint = latest_checkpoint(trained.run_dir)
    if checkpoint is None:
        raise RuntimeError(f"the RL run in {trained.run_dir} left no checkpoint")
    after_rl = await _evaluated(cfg, checkpoint / "actor", root / "eval-rl", "after RL", console)
    return CurriculumResult(
        before=before["eval/success_rate"],
        after_sft=after_sft["eval/success_rate"],
        after_rl=after_rl["eval/success_rate"],
        tasks=int(after_rl["eval/episodes"]),
        root=root,
    )


async def _evaluated(
    cfg: TrainConfig, model_path: Path, out_dir: Path, stage: str, console: Console
) -> dict[str, float]:
    """`evaluate_checkpoint`, announced and reported on the console."""
    console.print(f"[bold]held-out evaluation {stage}[/bold] ({model_path})")
    summary = await evaluate_checkpoint(cfg, model_path, out_dir)
    console.print(
        f"  success {summary['eval/success_rate']:.1%}, mean reward {summary['eval/reward_mean']:.3f} "
        f"over {summary['eval/episodes']:.0f} episodes; saved under {out_dir}"
    )
    return summary
