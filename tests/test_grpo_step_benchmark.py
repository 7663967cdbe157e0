"""`benchmarks/grpo_step.py --tiny`: the GRPO step benchmark runs the trainer's loop on CPU, all parts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # a benchmark script end to end
def test_grpo_step_benchmark_runs_tiny_and_reports_every_part(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    command = [sys.executable, "-m", "benchmarks.grpo_step", "--tiny", "--steps", "1", "--warmup", "1"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "2"}
    subprocess.run(
        [*command, "--json-out", str(out)], env=env, cwd=REPO, capture_output=True, timeout=300, check=True
    )
    figures = json.loads(out.read_text())
    seconds = figures["seconds"]
    assert set(seconds) == {"rollout", "recompute", "reference", "update", "sync", "host", "step"}
    assert seconds["rollout"] > 0 and seconds["update"] > 0 and seconds["step"] >= seconds["rollout"]
    assert sum(figures["host_seconds"].values()) == pytest.approx(seconds["host"], abs=2e-4)
    assert seconds["recompute"] == 0.0, "one epoch of one mini-batch takes its old logprobs from the update"
    assert figures["episodes"] == 4 and figures["train_tokens"] > 0 and figures["episodes_per_s"] > 0
    assert figures["device"] == "cpu" and figures["peak_memory_gib"] > 0
    assert figures["engine_batches"] >= 3 and figures["episode_seconds"]["generate"] > 0
    assert "train/pg_loss" in figures["losses"]
