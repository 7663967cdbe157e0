"""Push a sharded actor's weights through the bucketed path, then check the engines (test_weight_sync.py).

    torchrun --nproc-per-node 2 tests/weight_push_worker.py CHECKPOINT ENGINE_URL MASTER_PORT OUT_DIR

Every rank loads the tiny actor, moves its weights by the same seeded noise and shards it (FSDP2 over
gloo), then takes part in two pushes of small buckets: version 1 into an `HFEngine` in rank 0's
process (`InProcessSync`), version 2 over gloo into the `vistarl engine serve` at ENGINE_URL
(`DistributedSync`, SGLang's protocol). Then every rank gathers the trainer's full state dict, and
rank 0 writes to OUT_DIR/result.json: which in-process engine parameters differ from it bit for bit,
the largest logprob difference of each engine against a trainer model holding it (a batch of probes,
fp32), the version the served engine reports, whether a push whose transport fails midway raised on
rank 0 (the full state dict, gathered after it, shows the other rank was not left in a collective),
and whether the buckets of a small model whose rows do not split evenly over the ranks (7 rows and 1
row on 2 ranks) come out as its full state dict.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from collections.abc import Iterable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from transformers import PretrainedConfig

from tests.weight_probe import nudge, verify_batch
from vistarl.trainer.learner.fsdp import full_state_dict, init_distributed, rank_device, shard_model
from vistarl.trainer.learner.models import load_actor
from vistarl.trainer.rollout.engines.hf import HFEngine
from vistarl.trainer.rollout.engines.sglang import SGLangEngine
from vistarl.trainer.rollout.processor import VLProcessor
from vistarl.trainer.weights.buckets import Bucket, gathered_buckets
from vistarl.trainer.weights.in_process import InProcessSync
from vistarl.trainer.weights.nccl import DistributedSync, DistributedTarget
from vistarl.trainer.weights.sync import WeightSync
from vistarl.trainer.weights.transport import EngineCalls, Transport

BUCKET_BYTES = 2 * 1024 * 1024  # several buckets, one of them a lone tensor larger than the limit
TIMEOUT = timedelta(seconds=60)


def push_and_check(checkpoint: Path, engine_url: str, master_port: int, out_dir: Path) -> None:
    """The run the module docstring describes."""
    init_distributed(timeout=TIMEOUT)
    rank = dist.get_rank()
    actor = load_actor(checkpoint)
    nudge(actor, seed=5)
    config = actor.config
    actor = shard_model(actor, rank_device())
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, name="engines", daemon=True).start()
    calls = EngineCalls(loop, TIMEOUT.total_seconds())
    local = HFEngine.from_pretrained(checkpoint) if rank == 0 else None
    served = SGLangEngine(engine_url, VLProcessor.from_pretrained(checkpoint), retry_deadline_s=10)
    target = DistributedTarget("127.0.0.1", master_port, backend="gloo", timeout=TIMEOUT)
    transports: list[Transport | None] = [None, None]
    if local is not None:
        transports = [
            InProcessSync(local, calls),
            DistributedSync([served], calls, target, config.model_type),
        ]
    for version, transport in enumerate(transports, start=1):
        sync = WeightSync(config, torch.float32, BUCKET_BYTES, transport)
        sync.push(actor, version)
        sync.close()
    failed = push_failing_midway(actor, config, rank)
    full = full_state_dict(actor)
    uneven = uneven_rows_gather_whole(config)
    if local is not None:
        result = calls(check(full, local, served, checkpoint, engine_url))
        result |= {"uneven_rows_whole": uneven, "failed_push_raised": failed}
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "result.json").write_text(json.dumps(result))
        calls(local.close())
    calls(served.close())
    loop.call_soon_threadsafe(loop.stop)
    dist.destroy_process_group()


class EngineGone:
    """A transport whose engine vanishes after the first bucket."""

    def push(self, buckets: Iterable[Bucket], version: int) -> None:
        next(iter(buckets))
        raise ConnectionError("the engine went away")

    def reconnect(self, engines: Sequence[int] | None) -> None:
        """Nothing to form again."""

    def close(self) -> None:
        """Nothing to release."""


def push_failing_midway(actor: torch.nn.Module, config: PretrainedConfig, rank: int) -> bool:
    """Every rank: a push whose transport fails after one bucket (rank 0); whether it raised there. The
    ranks' next collective (the full state dict) then only works if every rank walked every bucket."""
    sync = WeightSync(config, torch.float32, BUCKET_BYTES, EngineGone() if rank == 0 else None)
    try:
        sync.push(actor, 3)
    except ConnectionError:
        return True
    return False


def uneven_rows_gather_whole(config: PretrainedConfig) -> bool:
    """Every rank: a sharded model whose row counts do not divide by the ranks (one of them fewer rows
    than ranks, so some rank holds none) gathers to its full state dict, bit for bit, in fp32 and bf16."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Linear(7, 1), torch.nn.LayerNorm(1))
    expected = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    fully_shard(model, mesh=init_device_mesh("cpu", (dist.get_world_size(),)))
    whole = True
    for dtype in (torch.float32, torch.bfloat16):
        for bucket in gathered_buckets(model, config, dtype, bucket_bytes=64):
            whole &= all(torch.equal(t, expected[name].to(dtype)) for name, t in bucket.tensors)
    return whole


async def check(
    full: dict[str, torch.Tensor], local: HFEngine, served: SGLangEngine, checkpoint: Path, engine_url: str
) -> dict[str, Any]:
    """Rank 0: the in-process engine's parameters against `full`, both engines' logprobs against a
    trainer model holding `full`, and the served version."""
    live = local.model.state_dict()
    trainer = load_actor(checkpoint)
    trainer.load_state_dict(full)
    processor = VLProcessor.from_pretrained(checkpoint)
    async with httpx.AsyncClient() as client:
        info = (await client.get(f"{engine_url}/model_info", timeout=10)).json()
    return {
        "parameters": sorted(full),
        "engine_parameters": sorted(live),
        "differing": [name for name, tensor in full.items() if not torch.equal(live[name], tensor)],
        "in_process_max_diff": await verify_batch(local, trainer, processor, tolerance=1.0),
        "served_max_diff": await verify_batch(served, trainer, processor, tolerance=1.0),
        "served_version": info["weight_version"],
        "local_version": local.weight_version,
    }


if __name__ == "__main__":
    push_and_check(Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), Path(sys.argv[4]))
