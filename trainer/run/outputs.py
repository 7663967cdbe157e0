"""What a run leaves and shows: metrics.jsonl, a reward curve, TensorBoard, wandb, sample episodes, console.

Everything lives under the run directory:

- `config.yaml`: the resolved configuration;
- `metrics.jsonl`: one JSON object per step (`step` plus every metric);
- `reward_curve.png`: mean reward and success rate (or the SFT loss) per step, with held-out success
  where the run evaluates (`train.eval_every`), redrawn after a step with held-out figures, after the
  first step that comes `CURVE_EVERY_S` after the last drawing, and at the end (matplotlib's object API
  renders it with Agg, no display needed, in a few hundred milliseconds, which a sub-second step cannot
  pay every time; `draw_curve` redraws it from `metrics.jsonl`);
- `tensorboard/`: the same scalars for TensorBoard;
- `samples/step-NNNNNN/<episode>/`: a few trajectories per step as `trajectory.json` plus their images;
- Weights & Biases, with `logging.wandb.mode` online or offline: the config, the same metrics, the curve
  and the samples (`trainer/run/wandb_sink.py`), its run under `wandb/`.

Only rank 0 logs; other ranks never build a `RunLogger`.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from matplotlib.figure import Figure
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from torch.utils.tensorboard import SummaryWriter

from vistarl.clients.images import decode_image
from vistarl.trainer.config import TrainConfig, WandbConfig
from vistarl.trainer.rollout.trajectory import Trajectory
from vistarl.trainer.run.stack import ENV_SERVER_LOG
from vistarl.trainer.run.wandb_sink import WandbSink

__all__ = [
    "CURVE_FILE",
    "METRICS_FILE",
    "RunLogger",
    "draw_curve",
    "failure_places",
    "read_metrics",
    "save_trajectory",
    "timed",
]

METRICS_FILE = "metrics.jsonl"
CURVE_FILE = "reward_curve.png"
CURVE_EVERY_S = 30.0
REWARD_KEY = "reward/mean"
SUCCESS_KEY = "env/success"
CURVES = [(REWARD_KEY, "mean reward"), (SUCCESS_KEY, "success rate"), ("train/nll", "SFT loss (nats/token)")]
"""The panels of the curve: RL runs report reward and success, SFT runs their loss."""
HELD_OUT = {SUCCESS_KEY: ("eval/success_rate", "held out, greedy")}
"""A second line on a panel: the periodic held-out evaluation (`train.eval_every`) over training success."""


@contextlib.contextmanager
def timed(timings: dict[str, float], name: str) -> Iterator[None]:
    """Add the block's wall time to `timings[name]`: a step's `time/...` metrics."""
    started = time.perf_counter()
    try:
        yield
    finally:
        timings[name] = timings.get(name, 0.0) + time.perf_counter() - started


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The step records of `metrics.jsonl`, in order (none when the file does not exist)."""
    path = run_dir / METRICS_FILE
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def draw_curve(records: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """Plot each of `CURVES` that `records` (metrics.jsonl's) report, per step, with its `HELD_OUT` line."""
    panels = [(key, title) for key, title in CURVES if any(key in r for r in records)]
    panels = panels or CURVES[:1]
    steps = [r["step"] for r in records]
    figure = Figure(figsize=(5 * len(panels), 3.5))
    axes = figure.subplots(1, len(panels), squeeze=False)
    for axis, (key, title) in zip(axes[0], panels, strict=True):
        lines = [(key, "training")]
        if key in HELD_OUT and any(HELD_OUT[key][0] in r for r in records):
            lines.append(HELD_OUT[key])
        for line_key, label in lines:
            points = [(r["step"], r[line_key]) for r in records if line_key in r]
            axis.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
        if len(lines) > 1:
            axis.legend()
        axis.set_title(title)
        axis.set_xlabel("step")
        axis.grid(alpha=0.3)
        if steps:
            axis.set_xlim(min(steps) - 0.5, max(steps) + 0.5)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    return path


def failure_places(cfg: TrainConfig, run_dir: Path) -> str:
    """Where the reasons of a run's failed episodes are, for an error that sends the user to look: the
    env's log if this run serves the env (else where the env runs), and the failed attempts."""
    if cfg.env.url is not None:
        env = f"the logs of the env server at {cfg.env.url}"
    elif cfg.env.serve:
        env = str(run_dir / ENV_SERVER_LOG)
    else:
        env = "the rollout workers' logs (the env runs inside them)"
    if cfg.rollout.queue is None:
        return f"{env} and the failed-attempt warnings above"
    dlq = f"vistarl queue dlq --namespace {cfg.rollout.namespace} --redis-url <rollout.queue>"
    return f"{env} and the dead letters ({dlq})"


def save_trajectory(trajectory: Trajectory, out_dir: Path) -> Path:
    """Write `trajectory.json` plus one PNG per image (named in the JSON); returns the JSON's path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    names = []
    for index, url in enumerate(trajectory.images):
        name = f"image-{index:02d}.png"
        decode_image(url).save(out_dir / name)
        names.append(name)
    record = {**trajectory.to_dict(), "images": names}
    path = out_dir / "trajectory.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path


class RunLogger:
    """Rank 0's sinks for one run: files, TensorBoard, optional Weights & Biases, and a rich progress
    display."""

    def __init__(
        self,
        run_dir: Path,
        config: Mapping[str, Any],
        *,
        total_steps: int,
        start_step: int = 0,
        tensorboard: bool = True,
        wandb: WandbConfig | None = None,
        console: Console | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.console = console or Console()
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(yaml.safe_dump(dict(config), sort_keys=False))
        self.history = [r for r in read_metrics(run_dir) if r.get("step", math.inf) <= start_step]
        self._curve_due = 0.0  # the first step draws
        self._rewrite_metrics()
        self.tensorboard = SummaryWriter(str(run_dir / "tensorboard")) if tensorboard else None
        self.wandb = WandbSink(run_dir, config, wandb) if wandb and wandb.mode != "disabled" else None
        self.progress = Progress(
            TextColumn("[bold]step"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("reward {task.fields[reward]}  success {task.fields[success]}  {task.fields[speed]}"),
            TimeElapsedColumn(),
            console=self.console,
        )
        self._task = self.progress.add_task(
            "train", total=total_steps, completed=start_step, reward="-", success="-", speed=""
        )
        self.progress.start()

    def log_step(self, step: int, metrics: Mapping[str, float], notes: Sequence[str] = ()) -> None:
        """Record one finished step everywhere and refresh the curve and the display; `notes` are printed
        under the step's line (why some of its episodes were left out)."""
        record = {"step": step, "time": time.time(), **{k: float(v) for k, v in metrics.items()}}
        self.history.append(record)
        with (self.run_dir / METRICS_FILE).open("a", encoding="utf-8") as sink:
            sink.write(json.dumps(record) + "\n")
        if self.tensorboard is not None:
            for name, value in metrics.items():
                self.tensorboard.add_scalar(name, value, step)
            self.tensorboard.flush()
        if self.wandb is not None:
            self.wandb.log_metrics(step, metrics)
        if any(k.startswith("eval/") for k in metrics) or time.monotonic() >= self._curve_due:
            self.draw_curve()
        self._show(step, metrics)
        for note in notes:
            self.console.print(f"step {step}: {note}", style="yellow", markup=False, highlight=False)

    def draw_curve(self) -> Path:
        """Redraw `reward_curve.png` from this run's history."""
        self._curve_due = time.monotonic() + CURVE_EVERY_S
        path = draw_curve(self.history, self.run_dir / CURVE_FILE)
        if self.wandb is not None and self.history:
            self.wandb.log_curve(self.history[-1]["step"], path)
        return path

    def save_samples(self, step: int, trajectories: Sequence[Trajectory], limit: int) -> None:
        """Keep the first `limit` trajectories of a step, with their images, under `samples/`."""
        root = self.run_dir / "samples" / f"step-{step:06d}"
        for trajectory in trajectories[:limit]:
            save_trajectory(trajectory, root / trajectory.episode_id)
        if self.wandb is not None:
            self.wandb.log_samples(step, trajectories[:limit])

    def note(self, message: str) -> None:
        """A line on the console above the progress bar."""
        self.console.print(message)

    def close(self) -> None:
        """Draw the curve a last time, stop the display and flush and close every sink."""
        if self.history:
            self.draw_curve()
        self.progress.stop()
        if self.tensorboard is not None:
            self.tensorboard.close()
        if self.wandb is not None:
            self.wandb.close()

    def _show(self, step: int, metrics: Mapping[str, float]) -> None:
        """Advance the progress bar and print the step's headline numbers."""
        reward = _fmt(metrics.get(REWARD_KEY))
        success = _fmt(metrics.get(SUCCESS_KEY))
        speed = f"{metrics['perf/tokens_per_s']:.0f} tok/s" if "perf/tokens_per_s" in metrics else ""
        self.progress.update(self._task, completed=step, reward=reward, success=success, speed=speed)
        headline = _pick(
            metrics,
            ("reward/mean", "env/success", "rollout/turns", "rollout/response_tokens"),
            (
                "train/nll",
                "train/logprob_abs_diff",
                "train/pg_clip_frac",
                "train/ppo_kl",
                "train/entropy",
                "train/grad_norm",
            ),
            ("time/rollout", "time/train", "time/sync", "time/step", "perf/tokens_per_s"),
        )
        self.console.print(f"[bold]step {step}[/bold]  " + "  ".join(f"{k}={_fmt(v)}" for k, v in headline))

    def _rewrite_metrics(self) -> None:
        """Keep only the history up to the start step (steps after a resumed checkpoint are run again)."""
        lines = "".join(json.dumps(record) + "\n" for record in self.history)
        (self.run_dir / METRICS_FILE).write_text(lines)


def _pick(metrics: Mapping[str, float], *groups: Iterable[str]) -> list[tuple[str, float]]:
    """The metrics named in `groups`, in that order, skipping absent ones."""
    return [(key, metrics[key]) for group in groups for key in group if key in metrics]


def _fmt(value: float | None) -> str:
    """A short number for the console."""
    if value is None:
        return "-"
    return f"{value:.3g}" if abs(value) < 1e4 else f"{value:.0f}"
