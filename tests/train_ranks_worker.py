"""Two steps of `run_training` under torchrun (`tests/test_rank_commands.py`): rank 0 leads, the rest follow.

    torchrun --nproc-per-node 2 tests/train_ranks_worker.py CHECKPOINT OUT_DIR

Rank 0 plays the counter env in process with a scripted policy; every rank trains its share. No
`train.run_dir` is set, so the ranks must agree on the `runs/ranks-<timestamp>` that rank 0 picks
(under the working directory). Each rank writes what its `run_training` returned to
`OUT_DIR/rank<R>.json`.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import torch.distributed as dist

from tests.test_train_loop import odd_seeds_count, scripted_config
from vistarl.trainer.config import TrainConfig
from vistarl.trainer.learner.fsdp import init_distributed
from vistarl.trainer.rollout.engines.scripted import ScriptedEngine
from vistarl.trainer.rollout.processor import VLProcessor
from vistarl.trainer.run.train import run_training


def main(checkpoint: Path, out_dir: Path) -> None:
    """Train two steps on every rank and record each rank's result."""
    init_distributed()
    rank = dist.get_rank()
    run = scripted_config(checkpoint, Path("unused"), steps=2).model_dump()
    cfg = TrainConfig.model_validate({**run, "train": {**run["train"], "run_dir": None}})
    engine = ScriptedEngine(VLProcessor.from_pretrained(checkpoint), odd_seeds_count) if rank == 0 else None
    result = asyncio.run(run_training(cfg, name="ranks", engine=engine))
    record = {"run_dir": str(result.run_dir), "history": result.history, "checkpoint": str(result.checkpoint)}
    (out_dir / f"rank{rank}.json").write_text(json.dumps(record))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
