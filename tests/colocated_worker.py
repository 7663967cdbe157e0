"""Two steps of `run_training` under torchrun with the embedded engine (`tests/test_rank_engines.py`): each
rank embeds an `HFEngine` of its own, rank 0's pool spreads the episodes over both, and each rank pushes
its engine in process.

    torchrun --nproc-per-node 2 tests/colocated_worker.py CHECKPOINT OUT_DIR [REDIS_URL]

GRPO on `tests/test_learning.py`'s one-turn env and reward (the share of even token ids, so that every
update changes the weights), 8 episodes a step, 4 at once, fp32 on the CPU; rank 0 writes its metric
history to OUT_DIR/history.json. Rank 1's engine takes each push's last bucket a second late, as an engine
busy with a batch would: rank 0 must not play the next step's episodes on it before it has. With
REDIS_URL the run's queue is there, shared by both ranks, whose workers then each play on their own
engine (`rollout.spreads_workers`); each rank writes how many requests its engine took to
OUT_DIR/requests-rank<R>.json.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import torch.distributed as dist

from tests.test_learning import learning_config
from tests.test_train_loop import with_changes
from vistarl.trainer.learner.fsdp import init_distributed
from vistarl.trainer.rollout.engines.hf import HFEngine
from vistarl.trainer.run.train import run_training

LATE_S = 1.0
"""How late rank 1's engine takes the last bucket of each push."""


def late_final_loads() -> None:
    """Make this process's engines take each push's last bucket `LATE_S` late."""
    load_weights = HFEngine.load_weights

    async def late(
        self: HFEngine, load: Any, weight_version: str | None = None, *, final: bool = True
    ) -> str:
        if final:
            await asyncio.sleep(LATE_S)
        return await load_weights(self, load, weight_version, final=final)

    HFEngine.load_weights = late  # type: ignore[method-assign]


def counted_requests() -> list[int]:
    """Count the generation requests this process's engines take (from its own workers, or over HTTP)."""
    taken = [0]
    generate = HFEngine.generate

    async def counting(self: HFEngine, request: Any) -> Any:
        taken[0] += 1
        return await generate(self, request)

    HFEngine.generate = counting  # type: ignore[method-assign]
    return taken


def main(checkpoint: Path, out_dir: Path, redis_url: str | None) -> None:
    """Train two steps on every rank, each generating on its own engine."""
    init_distributed()
    rank = dist.get_rank()
    if rank == 1:
        late_final_loads()
    taken = counted_requests()
    cfg = learning_config(checkpoint, out_dir / "run", steps=2)
    cfg = with_changes(cfg, "rollout", rollout_batch_size=1, concurrency=4)
    if redis_url is not None:
        cfg = with_changes(cfg, "rollout", queue=redis_url, namespace=f"colocated-{out_dir.name}")
    result = asyncio.run(run_training(cfg, name="colocated"))
    if rank == 0:
        (out_dir / "history.json").write_text(json.dumps(result.history))
    (out_dir / f"requests-rank{rank}.json").write_text(json.dumps(taken[0]))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else None)
