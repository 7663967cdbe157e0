"""Every rank's embedded engine under torchrun (`vistarl.trainer.run.rank_engines`): two CPU ranks (gloo)
each generate part of every step on an engine of their own, and both serve each update's weights after
it; and the KV cache an engine's share of the episodes takes on a GPU."""

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


@pytest.mark.slow  # two torchrun ranks: a minute or more of CPU
def test_two_ranks_each_generate_on_their_own_engine_and_both_serve_each_updates_weights(
    tiny_qwen25: Path, tmp_path: Path
) -> None:
    """`tests/colocated_worker.py`: GRPO whose every update changes the weights, 8 episodes a step. Each
    step, both engines take episodes; each engine's turns report the step's policy version (lag 0, none
    stale), and their logprobs are the updated trainer's to fp32 precision, so both hold its weights."""
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    worker = [str(REPO / "tests" / "colocated_worker.py"), str(tiny_qwen25), str(tmp_path)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    command = [*launcher, "--master-port", str(free_port()), *worker]
    subprocess.run(command, env=env, cwd=tmp_path, timeout=400, check=True)
    history = json.loads((tmp_path / "history.json").read_text())
    assert [record["step"] for record in history] == [1, 2]
    for record in history:
        taken = [record["rollout/engine_requests/0"], record["rollout/engine_requests/1"]]
        assert all(n > 0 for n in taken) and sum(taken) == 8, record
        assert (record["rollout/episodes"], record["rollout/stale"], record["rollout/policy_lag"]) == (
            8,
            0,
            0,
        )
        assert record["train/grad_norm"] > 0  # the update moved the weights the next step plays
        assert record["train/logprob_abs_diff"] < 1e-5
