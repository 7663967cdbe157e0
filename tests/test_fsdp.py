"""FSDP2 over CPU ranks (gloo, torchrun) takes the same `PolicyTrainer.update` as one plain process.

`tests/fsdp_worker.py` builds the trainer and takes the update: under torchrun in micro-batches of at
most `MICRO_BATCH_TOKENS` (several per mini-batch), in the plain process each mini-batch in one, so
neither the step nor the metrics may depend on how a mini-batch is split. The plain run is shared.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import pytest
import torch
from safetensors.torch import load_file

from benchmarks.train_step import benchmark_config, build_actor, counted_params
from tests.fsdp_worker import train_step
from tests.machine import outlasting
from tests.test_update import assert_same_step
from vistarl.httpserver.launch import free_port
from vistarl.trainer.learner.fsdp import full_state_dict
from vistarl.trainer.learner.models import load_actor, load_critic
from vistarl.trainer.weights.buckets import pushed_dtype
from vistarl.trainer.weights.names import is_tied

REPO = Path(__file__).resolve().parent.parent
MICRO_BATCH_TOKENS = 96
RANKS_S = 240.0
"""How long torchrun's ranks may take to update here."""
BENCHMARK_S = 300.0
"""How long a benchmark script may take here."""

Run = tuple[dict[str, Any], dict[str, torch.Tensor]]


def read_run(out_dir: Path) -> Run:
    """A worker's metrics and weights."""
    return json.loads((out_dir / "metrics.json").read_text()), load_file(out_dir / "weights.safetensors")


@pytest.fixture(scope="module")
def plain_run(tiny_qwen25: Path, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """The update in this process, on plain modules."""
    out_dir = tmp_path_factory.mktemp("plain")
    train_step(tiny_qwen25, out_dir, micro_batch_tokens=1024)
    return read_run(out_dir)


def sharded_run(checkpoint: Path, out_dir: Path, ranks: int, *overrides: str) -> Run:
    """The update under torchrun on `ranks` CPU ranks, with config `overrides`."""
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks)]
    worker = [str(REPO / "tests" / "fsdp_worker.py"), str(checkpoint), str(out_dir), str(MICRO_BATCH_TOKENS)]
    worker += overrides
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    command = [*launcher, "--master-port", str(free_port()), *worker]
    subprocess.run(command, env=env, cwd=REPO, timeout=RANKS_S, check=True)
    return read_run(out_dir)


def assert_same_update(checkpoint: Path, sharded: Run, plain: Run) -> None:
    """Equal metrics (but the timings), and the same step of the actor and of the critic."""
    (sharded_metrics, sharded_weights), (plain_metrics, plain_weights) = sharded, plain
    assert plain_metrics["train/trajectories"] == 6
    for name, value in plain_metrics.items():
        if name.startswith("train/"):
            assert sharded_metrics[name] == pytest.approx(value, rel=1e-4, abs=1e-6), name
    before = {
        "actor": full_state_dict(load_actor(checkpoint)),
        "critic": full_state_dict(load_critic(checkpoint)),
    }
    for model, start in before.items():
        prefix = f"{model}."
        assert_same_step(
            start,
            {k.removeprefix(prefix): v for k, v in plain_weights.items() if k.startswith(prefix)},
            {k.removeprefix(prefix): v for k, v in sharded_weights.items() if k.startswith(prefix)},
        )


@pytest.mark.slow  # two torchrun ranks: minutes of CPU
@outlasting(RANKS_S)
def test_two_ranks_update_like_one_process(tiny_qwen25: Path, plain_run: Run, tmp_path: Path) -> None:
    sharded = sharded_run(tiny_qwen25, tmp_path, ranks=2)
    assert (sharded[0]["world"], plain_run[0]["world"]) == (2, 0)
    assert_same_update(tiny_qwen25, sharded, plain_run)


@pytest.mark.slow  # a torchrun rank: a minute of CPU
@outlasting(RANKS_S)
def test_one_rank_keeping_gathered_weights_updates_like_one_process(
    tiny_qwen25: Path, plain_run: Run, tmp_path: Path
) -> None:
    """On one rank the trainer keeps gathered weights through each optimizer step's micro-batches; four
    steps in two epochs after a no-grad recompute would drift from the plain run on a stale copy."""
    sharded = sharded_run(tiny_qwen25, tmp_path, ranks=1)
    assert sharded[0]["world"] == 1
    assert_same_update(tiny_qwen25, sharded, plain_run)


@pytest.mark.slow  # a torchrun rank: a minute of CPU
def test_the_critic_offloaded_to_the_host_updates_like_one_process(
    tiny_qwen25: Path, plain_run: Run, tmp_path: Path
) -> None:
    """`train.optimizer_offload: critic` (FSDP2's CPU offload of the critic's shards, gradients and AdamW
    state) takes the plain run's update: on the CPU the placement is the same, the offload's code path is
    not (its gathers, gradient copies and the optimizer over host shards)."""
    sharded = sharded_run(tiny_qwen25, tmp_path, 1, "train.optimizer_offload=critic")
    assert sharded[0]["world"] == 1
    assert_same_update(tiny_qwen25, sharded, plain_run)


PEAK_TFLOPS = 989.0
"""`benchmarks/train_step.py`'s default `--peak-tflops`."""
BENCHMARK_ENV = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


def _printed(command: list[str]) -> list[str]:
    """Run a benchmark command on CPU: the lines it printed, its JSON line of figures last."""
    done = subprocess.run(
        command, env=BENCHMARK_ENV, cwd=REPO, capture_output=True, text=True, timeout=BENCHMARK_S, check=True
    )
    return done.stdout.strip().splitlines()


def _figures(command: list[str]) -> dict[str, Any]:
    """Run a benchmark command on CPU: its JSON line of figures."""
    return cast(dict[str, Any], json.loads(_printed(command)[-1]))


def _torchrun(ranks: int, *args: str) -> list[str]:
    """The command line of a benchmark under `torchrun --nproc_per_node ranks`."""
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks), *args]


def _train_step_args(checkpoint: Path, micro_batches: int, *extra: str) -> list[str]:
    """`benchmarks.train_step --tiny` for one timed step and no warm-up: the first update, whose loss and
    gradient norm are the figures compared, comes first either way."""
    command = ["-m", "benchmarks.train_step", "--tiny", "--processor", str(checkpoint), "--steps", "1"]
    return [*command, "--warmup", "0", "--micro-batches", str(micro_batches), *extra]


@pytest.fixture(scope="module")
def tiny_step(tiny_qwen25: Path) -> dict[str, Any]:
    """The benchmark's figures for one micro-batch of one 128-token sequence, on one rank without torchrun."""
    return _figures([sys.executable, *_train_step_args(tiny_qwen25, 1, "--micro-batch-tokens", "128")])


@pytest.mark.slow  # a benchmark script end to end
@outlasting(BENCHMARK_S)
def test_train_step_benchmark_runs_tiny(tiny_step: dict[str, Any]) -> None:
    """`benchmarks/train_step.py --tiny` takes the GPU benchmark's code path on CPU and reports figures: N is
    the tiny model's count, and each MFU is its rate's FLOPs (6N a token to update, 2N to recompute)
    over the peak."""
    assert tiny_step["model"] == "tiny-qwen2.5-vl" and tiny_step["micro_batches"] == 1
    _, config = benchmark_config("qwen2_5_vl_3b", tiny=True)
    params = counted_params(build_actor(config, torch.device("cpu")))
    assert tiny_step["world_size"] == 1 and tiny_step["params_counted"] == params
    peak = PEAK_TFLOPS * 1e12
    assert tiny_step["update_mfu"] == pytest.approx(6 * params * tiny_step["update_tokens_per_s"] / peak)
    assert tiny_step["recompute_mfu"] == pytest.approx(
        2 * params * tiny_step["recompute_tokens_per_s"] / peak
    )
    assert math.isfinite(tiny_step["first_loss"]) and math.isfinite(tiny_step["first_grad_norm"])


@pytest.mark.slow  # a benchmark script end to end
@outlasting(3 * BENCHMARK_S)  # the one-rank figures of the fixture, then two runs
def test_train_step_benchmark_on_two_ranks_has_the_loss_of_one_rank_on_the_same_global_batch(
    tiny_qwen25: Path, tiny_step: dict[str, Any]
) -> None:
    """2 ranks of 2 micro-batches each see the 1-rank run's 4 micro-batches: same first loss and
    gradient norm, so the 2-GPU figures of docs/benchmarks.md compare like with like. The one rank runs
    without torchrun, in the one-rank group the benchmark makes itself."""
    two = _figures(_torchrun(2, *_train_step_args(tiny_qwen25, 2)))
    one = _figures([sys.executable, *_train_step_args(tiny_qwen25, 4)])
    assert (two["world_size"], one["world_size"]) == (2, 1)
    assert two["first_loss"] == pytest.approx(one["first_loss"], rel=1e-5)
    assert two["first_grad_norm"] == pytest.approx(one["first_grad_norm"], rel=1e-4)
    assert tiny_step["first_loss"] != pytest.approx(one["first_loss"], rel=1e-5), "the loss is the batch's"


@pytest.mark.slow  # a benchmark script end to end
@outlasting(BENCHMARK_S)
def test_weight_sync_benchmark_pushes_from_two_torchrun_ranks_to_each_engine() -> None:
    """`benchmarks/weight_sync.py --tiny` under torchrun: every transport's pushes reach their engine,
    which reports every pushed version (the benchmark checks it after each push, and prints it), and a
    push's size is the tiny model's weights in bfloat16 but the tied ones."""
    transports = ["nccl", "disk", "in_process"]
    benchmark = ["-m", "benchmarks.weight_sync", "--tiny", "--pushes", "1", "--bucket-mb", "4"]
    printed = _printed(_torchrun(2, *benchmark, "--transports", *transports))
    figures = json.loads(printed[-1])
    assert figures["trainer_ranks"] == 2 and figures["engine_device"] == "cpu"
    pushed = [line.split(":")[0] for line in printed if re.fullmatch(r"\w+ v\d+: [\d.]+ s", line)]
    assert pushed == ["nccl v1", "nccl v2", "disk v3", "disk v4", "in_process v5", "in_process v6"]
    assert list(figures["sync_s"]) == transports and figures["nccl_connect_s"] is not None
    _, config = benchmark_config("qwen2_5_vl_3b", tiny=True)
    state = build_actor(config, torch.device("cpu")).state_dict()
    weights = sum(
        t.numel() * pushed_dtype(t, torch.bfloat16).itemsize
        for name, t in state.items()
        if not is_tied(name, config)
    )
    assert figures["weights_gib"] == pytest.approx(weights / 2**30)
