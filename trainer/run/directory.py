"""A run's directory: `train.run_dir`, or a fresh (or, resuming, the newest) `runs/<name>-<timestamp>`.

Rank 0 chooses it and every rank takes rank 0's choice, so a run started across a second boundary
still writes to one place. The RL loop and SFT both name their runs this way.
"""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path

from vistarl.trainer.config import TrainConfig
from vistarl.trainer.learner.checkpoint import latest_checkpoint
from vistarl.trainer.run.ranks import broadcast_bytes, current_rank

__all__ = ["agreed_run_dir", "resolve_run_dir", "run_name"]


def run_name(config: Path | None, env: str) -> str:
    """What a run is named after: its config, led by its env where the config's name does not start with
    the env's (`sokoban_tiny`; `maze-sokoban_tiny` for that config with `env.name=maze`); the env alone
    without a config. `env` is a registered name or an import path, whose last part names it."""
    label = env.rpartition(".")[2]
    if config is None:
        return label
    return config.stem if config.stem.startswith(label) else f"{label}-{config.stem}"


def resolve_run_dir(cfg: TrainConfig, name: str, resume: bool) -> Path:
    """`train.run_dir`, else `runs/<name>-<timestamp>` (when resuming: the newest such run)."""
    if cfg.train.run_dir is not None:
        return cfg.train.run_dir
    if resume:
        candidates = sorted(Path("runs").glob(f"{name}-*"), key=lambda p: p.name)
        with_checkpoints = [p for p in candidates if latest_checkpoint(p) is not None]
        if with_checkpoints:
            return with_checkpoints[-1]
    return Path("runs") / f"{name}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


def agreed_run_dir(cfg: TrainConfig, name: str, resume: bool) -> Path:
    """Rank 0's `resolve_run_dir` on every rank (call it on all of them)."""
    chosen = os.fsencode(resolve_run_dir(cfg, name, resume)) if current_rank() == 0 else None
    return Path(os.fsdecode(broadcast_bytes(chosen)))
