"""FSDP2 on 2 CPU ranks (gloo, torchrun) takes the same training step as one plain process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from tests.fsdp_worker import train_step
from tests.servers import free_port
from trainer.learner.fsdp import full_state_dict
from trainer.learner.models import load_actor

REPO = Path(__file__).resolve().parent.parent


def test_two_ranks_match_one_process(tiny_qwen25: Path, tmp_path: Path) -> None:
    sharded_dir, plain_dir = tmp_path / "two-ranks", tmp_path / "one-process"
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    worker = [str(REPO / "tests" / "fsdp_worker.py"), str(tiny_qwen25), str(sharded_dir)]
    command = [*launcher, "--master-port", str(free_port()), *worker]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    with subprocess.Popen(command, env=env, cwd=REPO, start_new_session=True) as ranks:
        try:
            train_step(tiny_qwen25, plain_dir)
            assert ranks.wait(timeout=240) == 0
        finally:
            ranks.kill()

    sharded = json.loads((sharded_dir / "result.json").read_text())
    plain = json.loads((plain_dir / "result.json").read_text())
    assert (sharded["world"], plain["world"]) == (2, 1)
    with_images = [[any(i in (0, 2) for i in micro) for micro in rank] for rank in sharded["plan"]]
    assert [rank[0] for rank in with_images] in ([True, False], [False, True])  # the dummy-image case
    assert abs(sharded["loss"] - plain["loss"]) <= 1e-5 * abs(plain["loss"])
    assert abs(sharded["grad_norm"] - plain["grad_norm"]) <= 1e-5 * plain["grad_norm"]

    before = full_state_dict(load_actor(tiny_qwen25))
    after_sharded = load_file(sharded_dir / "weights.safetensors")
    after_plain = load_file(plain_dir / "weights.safetensors")
    assert set(after_sharded) == set(after_plain) == set(before)
    update_gap = sum(((after_sharded[k] - after_plain[k]).norm() ** 2 for k in before), torch.tensor(0.0))
    update = sum(((after_plain[k] - before[k]).norm() ** 2 for k in before), torch.tensor(0.0))
    assert update.sqrt() > 1.0  # every trained weight moved by about the learning rate
    assert update_gap.sqrt() <= 1e-4 * update.sqrt()
    assert max((after_sharded[k] - after_plain[k]).abs().max().item() for k in before) < 1e-4


def test_one_rank_keeps_gathered_weights_and_never_uses_stale_ones(tiny_qwen25: Path, tmp_path: Path) -> None:
    """On one rank the trainer keeps gathered weights from a no-grad pass through its micro-batches'
    backwards; the optimizer must never leave a stale gathered copy behind for the next forward."""
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1"]
    worker = [str(REPO / "tests" / "fsdp_worker.py"), str(tiny_qwen25), str(tmp_path), "keep-gathered"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    command = [*launcher, "--master-port", str(free_port()), *worker]
    subprocess.run(command, env=env, cwd=REPO, timeout=240, check=True)
    runs = load_file(tmp_path / "runs.safetensors")
    for step in range(3):
        kept, resharded = runs[f"True/logprobs/{step}"], runs[f"False/logprobs/{step}"]
        torch.testing.assert_close(kept, resharded, rtol=0, atol=1e-5)
    assert (runs["True/logprobs/2"] - runs["True/logprobs/0"]).abs().max() > 1e-2  # the steps moved it
    names = [k.removeprefix("True/weights/") for k in runs if k.startswith("True/weights/")]
    assert names
    for name in names:
        torch.testing.assert_close(
            runs[f"True/weights/{name}"], runs[f"False/weights/{name}"], rtol=0, atol=1e-6
        )


def test_train_step_benchmark_runs_tiny(tiny_qwen25: Path) -> None:
    """`benchmarks/train_step.py --tiny` takes the GPU benchmark's code path on CPU and reports figures."""
    command = [sys.executable, "-m", "benchmarks.train_step", "--tiny", "--processor", str(tiny_qwen25)]
    command += ["--steps", "1", "--warmup", "0", "--micro-batches", "1", "--micro-batch-tokens", "128"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=240, check=True)
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["model"] == "tiny-qwen2.5-vl" and figures["micro_batches"] == 1
    assert figures["params_counted"] > 0
    assert figures["update_tokens_per_s"] > 0 and figures["recompute_tokens_per_s"] > 0
