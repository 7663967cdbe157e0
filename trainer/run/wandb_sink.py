"""Weights & Biases as a sink of a run's logs (`logging.wandb`; docs/training.md, "Weights & Biases").

`RunLogger` (`trainer/run/outputs.py`) hands it what the run directory gets: the resolved config at the
start, every step's metrics as they reach `metrics.jsonl`, the reward curve each time it is drawn, and the
step's sample trajectories. A sample is logged as `samples/<k>/images`, its images captioned with the
episode, its status and its reward, and `samples/<k>/conversation`, its messages as HTML (`k` counts the
step's samples, so that W&B's step slider pages through them). The W&B run lives in the run directory's
`wandb/`: `mode: offline` writes it there with no network, for `wandb sync` to upload later.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from vistarl.clients.images import decode_image
from vistarl.trainer.config import WandbConfig
from vistarl.trainer.rollout.trajectory import Trajectory

__all__ = ["WandbSink", "conversation_html"]

CURVE_KEY = "reward_curve"


class WandbSink:
    """One W&B run, started with the run's config; `close()` finishes it."""

    def __init__(self, run_dir: Path, config: Mapping[str, Any], settings: WandbConfig) -> None:
        try:
            import wandb  # the optional extra vistarl[wandb], imported only by a run that logs to W&B
        except ImportError:
            raise RuntimeError(
                f"logging.wandb.mode={settings.mode} needs the wandb package: pip install 'vistarl[wandb]'"
            ) from None
        self.wandb = wandb
        self.run = wandb.init(
            project=settings.project,
            name=settings.name or run_dir.name,
            mode=settings.mode,
            dir=str(run_dir),
            config=dict(config),
        )

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        """One step's metrics."""
        self.run.log(dict(metrics), step=step)

    def log_curve(self, step: int, path: Path) -> None:
        """The reward curve as drawn after `step`."""
        self.run.log({CURVE_KEY: self.wandb.Image(str(path))}, step=step)

    def log_samples(self, step: int, trajectories: Sequence[Trajectory]) -> None:
        """A step's sample trajectories: each one's images, captioned, and its conversation."""
        media: dict[str, Any] = {}
        for index, trajectory in enumerate(trajectories):
            caption = (
                f"{trajectory.episode_id}: {trajectory.status.value}, reward {trajectory.episode_reward:g}"
            )
            images = [
                self.wandb.Image(decode_image(url), caption=f"{caption}, image {at}")
                for at, url in enumerate(trajectory.images)
            ]
            if images:
                media[f"samples/{index}/images"] = images
            media[f"samples/{index}/conversation"] = self.wandb.Html(conversation_html(trajectory))
        if media:
            self.run.log(media, step=step)

    def close(self) -> None:
        """Finish the run (an offline run's files are complete then)."""
        self.run.finish()


def conversation_html(trajectory: Trajectory) -> str:
    """A trajectory's messages as HTML: each role, then its text, with `[image]` where an image was."""
    parts = [f"<h4>{html.escape(trajectory.episode_id)}: turn rewards {trajectory.turn_rewards}</h4>"]
    for message in trajectory.messages:
        content = message.get("content", "")
        if not isinstance(content, str):
            content = "".join(part.get("text", "[image]") for part in content)
        parts.append(f"<p><b>{html.escape(message.get('role', ''))}</b><br>{html.escape(content)}</p>")
    return "\n".join(parts)
