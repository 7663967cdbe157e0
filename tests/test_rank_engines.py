"""Every rank's embedded engine under torchrun (`vistarl.trainer.run.rank_engines`): two CPU ranks (gloo)
each generate part of every step on an engine of their own, rank 0's workers on both or, with a shared
queue, each rank's workers on its own, and both serve each update's weights after it; and the KV cache an
engine's share of the episodes takes on a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vistarl.devtools.model_shapes import SHAPES, qwen_vl_config
from vistarl.httpserver.launch import free_port
from vistarl.trainer.run.rank_engines import kv_cache_bytes

REPO = Path(__file__).resolve().parent.parent


def test_the_kv_cache_of_an_engine_is_its_rows_times_its_positions_of_every_layers_keys_and_values() -> None:
    config = qwen_vl_config("qwen3_vl", SHAPES["qwen3_vl_2b"])  # 28 layers, 8 kv heads of 128
    per_position = 2 * 28 * 8 * 128 * 2  # keys and values in bf16: 112 KiB
    assert kv_cache_bytes(config, 16, 8192, torch.bfloat16) == 16 * 8192 * per_position == 14 * 2**30
    assert kv_cache_bytes(config, 8, 8192, torch.float32) == kv_cache_bytes(config, 16, 8192, torch.bfloat16)


def colocated_run(checkpoint: Path, out_dir: Path, *queue: str) -> list[dict[str, float]]:
    """`tests/colocated_worker.py` under torchrun on two CPU ranks (its queue `queue`, if given): rank 0's
    metric history."""
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    worker = [str(REPO / "tests" / "colocated_worker.py"), str(checkpoint), str(out_dir), *queue]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    command = [*launcher, "--master-port", str(free_port()), *worker]
    subprocess.run(command, env=env, cwd=out_dir, timeout=400, check=True)
    history: list[dict[str, float]] = json.loads((out_dir / "history.json").read_text())
    assert [record["step"] for record in history] == [1, 2]
    for record in history:
        assert (record["rollout/episodes"], record["rollout/stale"], record["rollout/policy_lag"]) == (
            8,
            0,
            0,
        )
        assert record["train/grad_norm"] > 0  # the update moved the weights the next step plays
        assert record["train/logprob_abs_diff"] < 1e-5
    return history


@pytest.mark.slow  # two torchrun ranks: a minute or more of CPU
def test_two_ranks_each_generate_on_their_own_engine_and_both_serve_each_updates_weights(
    tiny_qwen25: Path, tmp_path: Path
) -> None:
    """GRPO whose every update changes the weights, 8 episodes a step, rank 0's workers on both engines.
    Each step, both engines take episodes; each engine's turns report the step's policy version (lag 0,
    none stale), and their logprobs are the updated trainer's to fp32 precision, so both hold its
    weights."""
    for record in colocated_run(tiny_qwen25, tmp_path):
        taken = [record["rollout/engine_requests/0"], record["rollout/engine_requests/1"]]
        assert all(n > 0 for n in taken) and sum(taken) == 8, record


@pytest.mark.slow  # two torchrun ranks: a minute or more of CPU
def test_with_a_shared_queue_every_rank_plays_episodes_on_its_own_engine(
    tiny_qwen25: Path, tmp_path: Path, redis_url: str
) -> None:
    """The same run on a Redis queue: each rank's own workers take jobs and generate on its own engine, in
    process. Rank 0's pool sends no request over HTTP, both engines take episodes, and together they take
    the 16 of the two steps; lag 0, none stale, logprobs the trainer's (`colocated_run`)."""
    history = colocated_run(tiny_qwen25, tmp_path, redis_url)
    assert not [key for record in history for key in record if key.startswith("rollout/engine_requests/")]
    taken = [json.loads((tmp_path / f"requests-rank{rank}.json").read_text()) for rank in (0, 1)]
    assert all(n > 0 for n in taken) and sum(taken) == 16, taken
