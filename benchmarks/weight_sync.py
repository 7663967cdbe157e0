"""Seconds per weight sync of a Qwen2.5-VL-3B-shaped policy, from the trainer's ranks to a served engine.

    torchrun --nproc_per_node 1 -m benchmarks.weight_sync   # trainer on GPU 0, the engine on GPU 1
    torchrun --nproc_per_node 2 -m benchmarks.weight_sync   # 2 trainer ranks; the engine shares GPU 1
    .venv/bin/python -m benchmarks.weight_sync --tiny       # the same path on CPU, over gloo

The trainer's path, as `trainer.train` runs it after each update: every rank takes part in
`full_state_dict`, which gathers FSDP2's fp32 shards to rank 0's CPU; then rank 0 pushes to
`vistarl engine serve` in its own process, by one of

- `nccl`: `DistributedSync`, SGLang's protocol: bf16 buckets of `--bucket-mb`, each broadcast from rank 0
  while its `/update_weights_from_distributed` call is in flight, generation paused around them; the
  first push also forms the group (`/init_weights_update_group`), timed apart;
- `disk`: `DiskSync`: a bf16 safetensors directory that the engine loads (`/update_weights_from_disk`).

The engine starts from a checkpoint of the same weights, written by the same code. After each push its
`/model_info` must report the pushed version. Prints a markdown table and one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import torch
import torch.distributed as dist
from transformers import PretrainedConfig

from benchmarks.harness import benchmark_parser
from benchmarks.train_step import build_actor, process_group
from devtools.model_shapes import SHAPES, qwen_vl_config
from devtools.tiny_checkpoint import write_tiny_checkpoint
from tests.servers import free_port, running_process, vistarl_cmd
from trainer.learner.fsdp import full_state_dict, rank_device, shard_model
from trainer.learner.weight_sync import (
    DiskSync,
    DistributedSync,
    DistributedTarget,
    WeightSync,
    save_hf_weights,
)
from trainer.rollout.engines.sglang import SGLangEngine


@dataclass(frozen=True)
class Figures:
    """What one run measured, in seconds (means over the timed pushes)."""

    model: str
    trainer_ranks: int
    trainer_device: str
    engine_device: str
    weights_gib: float
    gather_s: float
    nccl_connect_s: float
    nccl_push_s: float
    nccl_sync_s: float
    disk_push_s: float
    disk_sync_s: float


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = benchmark_parser(__doc__)
    parser.add_argument("--tiny", action="store_true", help="tiny config on CPU, over gloo: checks the path")
    parser.add_argument("--engine-device", default=None, help="the engine's device (default: cuda:1 or cpu)")
    parser.add_argument("--nccl-pushes", type=int, default=3, help="timed pushes after the one that connects")
    parser.add_argument("--disk-pushes", type=int, default=1)
    parser.add_argument("--bucket-mb", type=int, default=512, help="the config's sync.bucket_mb")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Every rank gathers; rank 0 also runs the engine, pushes and prints."""
    args = parse_args(argv)
    with process_group():
        device = rank_device()
        config = qwen_vl_config("qwen2_5_vl", SHAPES["tiny" if args.tiny else "qwen2_5_vl_3b"])
        torch.manual_seed(0)
        actor = shard_model(build_actor(config, device), device, keep_gathered=dist.get_world_size() == 1)
        gather = _timed_gather(actor)
        if dist.get_rank() == 0:
            with tempfile.TemporaryDirectory() as tmp:
                asyncio.run(_lead(args, Path(tmp), config, device, gather))
        else:
            for _ in range(1 + 1 + args.nccl_pushes + args.disk_pushes):  # rank 0's gathers, one for one
                gather()


def _timed_gather(actor: torch.nn.Module) -> Callable[[], tuple[dict[str, torch.Tensor], float]]:
    """The trainer's gather (a collective: every rank calls it, rank 0 gets the weights) and its seconds."""

    def gather() -> tuple[dict[str, torch.Tensor], float]:
        dist.barrier()
        started = time.perf_counter()
        weights = full_state_dict(actor)
        return weights, time.perf_counter() - started

    return gather


async def _lead(
    args: argparse.Namespace,
    tmp: Path,
    config: PretrainedConfig,
    device: torch.device,
    gather: Callable[[], tuple[dict[str, torch.Tensor], float]],
) -> None:
    """Rank 0: write the engine's first checkpoint, serve it, time each transport's pushes, and print."""
    source = write_tiny_checkpoint(tmp / "source")  # the tokenizer and processor files the engine needs
    weights, _ = gather()
    save_hf_weights(weights, config, tmp / "initial", source, dtype=torch.bfloat16)
    gib = sum(t.numel() * 2 for t in weights.values()) / 2**30
    del weights
    engine_device = args.engine_device or ("cuda:1" if device.type == "cuda" else "cpu")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = vistarl_cmd(
        "engine", "serve", "--model", str(tmp / "initial"), "--port", str(port), "--device", engine_device
    )
    with running_process(
        [*command, "--log-level", "warning"], ready_url=f"{url}/health_generate", timeout=900
    ):
        engine = SGLangEngine(url)
        target = DistributedTarget(
            "127.0.0.1",
            free_port(),
            backend="nccl" if device.type == "cuda" else "gloo",
            bucket_bytes=args.bucket_mb * 2**20,
        )
        nccl = DistributedSync(engine, target, config, device=device, dtype=torch.bfloat16)
        disk = DiskSync(engine, tmp / "pushed", config, source, dtype=torch.bfloat16)
        versions = iter(range(1, 1000))
        gathers: list[float] = []

        async def pushes(sync: WeightSync, count: int) -> list[float]:
            """Seconds of each of `count` gather-then-push rounds' pushes; checks the served version."""
            seconds = []
            for _ in range(count):
                weights, gathered = gather()
                gathers.append(gathered)
                version = next(versions)
                seconds.append(await _seconds(sync.push(weights, version)))
                print(
                    f"{type(sync).__name__} v{version}: gather {gathered:.2f} s, push {seconds[-1]:.2f} s",
                    flush=True,
                )
                served = httpx.get(f"{url}/model_info", timeout=30).json()["weight_version"]
                if served != str(version):
                    raise AssertionError(f"pushed version {version}, the engine serves {served}")
            return seconds

        try:
            (first,) = await pushes(nccl, 1)
            nccl_s = await pushes(nccl, args.nccl_pushes)
            disk_s = await pushes(disk, args.disk_pushes)
            _print(_figures(args, device, engine_device, gib, gathers, first, nccl_s, disk_s))
        finally:
            await nccl.close()
            await engine.close()


def _figures(
    args: argparse.Namespace,
    device: torch.device,
    engine_device: str,
    gib: float,
    gathers: list[float],
    first: float,
    nccl_s: list[float],
    disk_s: list[float],
) -> Figures:
    """The run's figures from its timings."""
    gather_s = statistics.mean(gathers)
    return Figures(
        model="tiny-qwen2.5-vl" if args.tiny else "qwen2.5-vl-3b-shape",
        trainer_ranks=dist.get_world_size(),
        trainer_device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        engine_device=engine_device,
        weights_gib=gib,
        gather_s=gather_s,
        nccl_connect_s=first - statistics.mean(nccl_s),
        nccl_push_s=statistics.mean(nccl_s),
        nccl_sync_s=gather_s + statistics.mean(nccl_s),
        disk_push_s=statistics.mean(disk_s),
        disk_sync_s=gather_s + statistics.mean(disk_s),
    )


async def _seconds(work: Awaitable[None]) -> float:
    """Wall seconds of awaiting `work`."""
    started = time.perf_counter()
    await work
    return time.perf_counter() - started


def _print(figures: Figures) -> None:
    """A markdown table, then the same figures as one JSON line."""
    print(
        f"model={figures.model} weights={figures.weights_gib:.2f} GiB (bf16) "
        f"trainer={figures.trainer_ranks} x {figures.trainer_device} engine={figures.engine_device}"
    )
    print("| transport | gather s | push s | sync s (gather + push) |")
    print("|---|---:|---:|---:|")
    print(f"| nccl | {figures.gather_s:.2f} | {figures.nccl_push_s:.2f} | {figures.nccl_sync_s:.2f} |")
    print(f"| disk | {figures.gather_s:.2f} | {figures.disk_push_s:.2f} | {figures.disk_sync_s:.2f} |")
    print(f"nccl group formation (first push only): {figures.nccl_connect_s:.2f} s")
    print(json.dumps(asdict(figures)))


if __name__ == "__main__":
    main()
