"""Seconds per weight sync of a Qwen2.5-VL-3B- (or Qwen3-VL-2B-) shaped policy, from the trainer's ranks to
an engine, through the bucketed GPU-direct path the trainer runs after each update.

    torchrun --nproc_per_node 1 -m benchmarks.weight_sync                         # GPU 0 -> engine on GPU 1
    torchrun --nproc_per_node 4 -m benchmarks.weight_sync --engine-device cuda:3  # 4 ranks; engine on GPU 3
    torchrun --nproc_per_node 1 -m benchmarks.weight_sync --transports in_process # engine on the same GPU
    torchrun --nproc_per_node 1 -m benchmarks.weight_sync --shape qwen3_vl_2b     # the Qwen3-VL-2B shape
    .venv/bin/python -m benchmarks.weight_sync --tiny --transports nccl disk in_process   # CPU, gloo

Every rank holds its FSDP2 shards of a randomly initialised actor and runs `WeightSync.push`, as
`vistarl.trainer.run.train` does: bucket by bucket (`--bucket-mb`, the config's `sync.bucket_mb`) the shards
are cast to bf16 and all-gathered on the GPU, and rank 0 sends each bucket on while the next is gathered, by
one of

- `nccl`: `DistributedSync`, SGLang's protocol, into `vistarl engine serve` in its own process on
  `--engine-device` (its receiver loads each bucket straight into the parameters); generation paused
  around the push; the group is formed before the first push, timed apart;
- `disk`: `DiskSync`: a bf16 safetensors directory that the same server loads (host memory and disk);
- `in_process`: `InProcessSync` into an `HFEngine` in rank 0's process on rank 0's GPU (device to device).

**sync s** is the wall time of one push on rank 0, from a barrier to the engine holding the new version
(gather included), averaged over `--pushes` pushes after one untimed; **gather s** is the gather alone
(every rank walks the buckets and drops them). After every push the engine must report the pushed
version (`/model_info` for the server). Prints a markdown table and one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import functools
import itertools
import json
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import torch
import torch.distributed as dist
from transformers import PretrainedConfig

from benchmarks.harness import add_shape_argument, benchmark_parser, markdown_header
from benchmarks.train_step import benchmark_config, build_actor, process_group
from vistarl.devtools.model_shapes import REAL_SHAPES
from vistarl.devtools.servers import running_process, vistarl_cmd
from vistarl.devtools.tiny_checkpoint import write_tiny_checkpoint
from vistarl.httpserver.launch import free_port
from vistarl.trainer.learner.fsdp import full_state_dict, rank_device, shard_model
from vistarl.trainer.rollout.engines.hf import HFEngine
from vistarl.trainer.rollout.engines.sglang import SGLangEngine
from vistarl.trainer.weights.buckets import gathered_buckets, pushed_dtype
from vistarl.trainer.weights.disk import DiskSync, save_hf_weights
from vistarl.trainer.weights.in_process import InProcessSync
from vistarl.trainer.weights.names import is_tied
from vistarl.trainer.weights.nccl import DistributedSync, DistributedTarget
from vistarl.trainer.weights.sync import WeightSync
from vistarl.trainer.weights.transport import EngineCalls, Transport

TRANSPORTS = ("nccl", "disk", "in_process")
PUSH_DTYPE = torch.bfloat16


@dataclass(frozen=True)
class Figures:
    """What one run measured, in seconds (means over the timed pushes)."""

    model: str
    trainer_ranks: int
    trainer_device: str
    engine_device: str
    weights_gib: float
    bucket_mb: int
    pushes: int
    gather_s: float
    sync_s: dict[str, float]
    nccl_connect_s: float | None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = benchmark_parser(__doc__)
    parser.add_argument("--tiny", action="store_true", help="tiny config on CPU, over gloo: checks the path")
    add_shape_argument(parser)
    parser.add_argument("--transports", nargs="+", choices=TRANSPORTS, default=["nccl"])
    parser.add_argument(
        "--engine-device", default=None, help="the served engine's device (default: cuda:<ranks> or cpu)"
    )
    parser.add_argument("--pushes", type=int, default=3, help="timed pushes per transport, after one untimed")
    parser.add_argument("--bucket-mb", type=int, default=512, help="the config's sync.bucket_mb")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Every rank gathers and pushes; rank 0 also runs the engines, times and prints."""
    args = parse_args(argv)
    with process_group():
        device = rank_device()
        model, config = benchmark_config(args.shape, args.tiny)
        torch.manual_seed(0)
        actor = shard_model(build_actor(config, device), device, keep_gathered=dist.get_world_size() == 1)
        bench = _Bench(actor, config, device, args.bucket_mb * 2**20)
        initial = full_state_dict(actor)  # the engine's first checkpoint (rank 0; {} elsewhere)
        gather_s = statistics.mean([bench.timed(bench.gather) for _ in range(1 + args.pushes)][1:])
        if dist.get_rank() == 0:
            with tempfile.TemporaryDirectory() as tmp:
                sync_s, connect_s = _lead(args, bench, Path(tmp), initial)
            del initial
            _print(_figures(args, model, bench, gather_s, sync_s, connect_s))
        else:
            follower = bench.sync(None)
            for version in range(len(args.transports) * (1 + args.pushes)):  # rank 0's pushes, one for one
                bench.timed(functools.partial(follower.push, actor, version))


class _Bench:
    """One rank's actor and what it times."""

    def __init__(
        self, actor: torch.nn.Module, config: PretrainedConfig, device: torch.device, bucket: int
    ) -> None:
        self.actor = actor
        self.config = config
        self.device = device
        self.bucket_bytes = bucket

    def sync(self, transport: Transport | None) -> WeightSync:
        """This rank's `WeightSync` with `transport` (rank 0) or none (the other ranks)."""
        return WeightSync(self.config, PUSH_DTYPE, self.bucket_bytes, transport)

    def gather(self) -> None:
        """Walk the buckets and drop them: the gather alone."""
        collections.deque(gathered_buckets(self.actor, self.config, PUSH_DTYPE, self.bucket_bytes), maxlen=0)

    def timed(self, work: Callable[[], None]) -> float:
        """Seconds of `work` on this rank, from a barrier to the device being idle again."""
        dist.barrier()
        self._synchronize()
        started = time.perf_counter()
        work()
        self._synchronize()
        return time.perf_counter() - started

    def weights_gib(self) -> float:
        """GiB of one push."""
        state = self.actor.state_dict()
        pushed = [t for name, t in state.items() if not is_tied(name, self.config)]
        return sum(t.numel() * pushed_dtype(t, PUSH_DTYPE).itemsize for t in pushed) / 2**30

    def _synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def _lead(
    args: argparse.Namespace, bench: _Bench, tmp: Path, initial: dict[str, torch.Tensor]
) -> tuple[dict[str, float], float | None]:
    """Rank 0: write the engines' first checkpoint, run each transport's pushes, and check the versions."""
    source = write_tiny_checkpoint(tmp / "source", REAL_SHAPES[args.shape])  # its tokenizer and processor
    save_hf_weights(initial, bench.config, tmp / "initial", source, dtype=PUSH_DTYPE)
    initial.clear()
    engine_device = _engine_device(args, bench.device)
    sync_s: dict[str, float] = {}
    connect_s = None
    with _engine_loop() as calls, _served(args, tmp / "initial", engine_device) as url:
        versions = iter(range(1, 10_000))
        for kind in args.transports:
            seconds = []
            with contextlib.ExitStack() as cleanup:
                transport, served_version = _transport(kind, calls, url, bench, tmp, cleanup)
                if isinstance(transport, DistributedSync):
                    started = time.perf_counter()
                    transport.connect()
                    connect_s = time.perf_counter() - started
                sync = bench.sync(transport)
                for version in itertools.islice(versions, 1 + args.pushes):
                    seconds.append(bench.timed(functools.partial(sync.push, bench.actor, version)))
                    served = served_version()
                    if served != str(version):
                        raise AssertionError(f"{kind}: pushed version {version}, the engine serves {served}")
                    print(f"{kind} v{version}: {seconds[-1]:.3f} s", flush=True)
            sync_s[kind] = statistics.mean(seconds[1:])
    return sync_s, connect_s


def _engine_device(args: argparse.Namespace, device: torch.device) -> str:
    """`--engine-device`, else the first GPU after the trainer's (the last GPU if there is none), or cpu."""
    if args.engine_device is not None:
        return str(args.engine_device)
    if device.type != "cuda":
        return "cpu"
    return f"cuda:{min(dist.get_world_size(), torch.cuda.device_count() - 1)}"


@contextlib.contextmanager
def _engine_loop() -> Iterator[EngineCalls]:
    """An event loop on its own thread for the engines' calls, as `vistarl.trainer.run.train`'s main loop
    is."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="engines", daemon=True)
    thread.start()
    try:
        yield EngineCalls(loop, 900.0)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)


@contextlib.contextmanager
def _served(args: argparse.Namespace, checkpoint: Path, device: str) -> Iterator[str | None]:
    """`vistarl engine serve` on `checkpoint` while the block runs, if a transport needs a server."""
    if not {"nccl", "disk"} & set(args.transports):
        yield None
        return
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = vistarl_cmd(
        "engine", "serve", "--model", str(checkpoint), "--port", str(port), "--device", device,
        "--log-level", "warning",
    )  # fmt: skip
    with running_process(command, ready_url=f"{url}/health_generate", timeout=900):
        yield url


def _transport(
    kind: str, calls: EngineCalls, url: str | None, bench: _Bench, tmp: Path, cleanup: contextlib.ExitStack
) -> tuple[Transport, Callable[[], str]]:
    """The transport of `kind` and how to read the version its engine serves; `cleanup` closes both."""
    if kind == "in_process":
        engine = HFEngine.from_pretrained(tmp / "initial", device=str(bench.device))
        cleanup.callback(lambda: calls(engine.close()))
        return InProcessSync(engine, calls), lambda: engine.weight_version
    assert url is not None
    client = SGLangEngine(url)
    cleanup.callback(lambda: calls(client.close()))
    transport: Transport
    if kind == "nccl":
        backend = "nccl" if bench.device.type == "cuda" else "gloo"
        target = DistributedTarget("127.0.0.1", free_port(), backend=backend)
        transport = DistributedSync([client], calls, target, bench.config.model_type)
    else:
        source = tmp / "source"
        transport = DiskSync(
            [client], calls, tmp / "pushed", bench.config, source, dtype=PUSH_DTYPE, pause=True
        )
    cleanup.callback(transport.close)
    return transport, lambda: str(httpx.get(f"{url}/model_info", timeout=30).json()["weight_version"])


def _figures(
    args: argparse.Namespace,
    model: str,
    bench: _Bench,
    gather_s: float,
    sync_s: dict[str, float],
    connect_s: float | None,
) -> Figures:
    """The run's figures from its timings."""
    device = bench.device
    return Figures(
        model=model,
        trainer_ranks=dist.get_world_size(),
        trainer_device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        engine_device=_engine_device(args, device),
        weights_gib=bench.weights_gib(),
        bucket_mb=args.bucket_mb,
        pushes=args.pushes,
        gather_s=gather_s,
        sync_s=sync_s,
        nccl_connect_s=connect_s,
    )


def _print(figures: Figures) -> None:
    """A markdown table, then the same figures as one JSON line."""
    print(
        f"model={figures.model} weights={figures.weights_gib:.2f} GiB (bf16) bucket={figures.bucket_mb} MiB "
        f"trainer={figures.trainer_ranks} x {figures.trainer_device} served engine={figures.engine_device}"
    )
    print(
        markdown_header(
            "transport", "trainer ranks", "gather s", "**sync s** (gather + send)", text=("transport",)
        )
    )
    for kind, seconds in figures.sync_s.items():
        print(f"| {kind} | {figures.trainer_ranks} | {figures.gather_s:.3f} | **{seconds:.3f}** |")
    if figures.nccl_connect_s is not None:
        print(f"nccl group formation (once, before the first push): {figures.nccl_connect_s:.2f} s")
    print(json.dumps(asdict(figures)))


if __name__ == "__main__":
    main()
