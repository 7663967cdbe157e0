"""`benchmarks/grpo_step.py --tiny`: the GRPO step benchmark runs the trainer's loop on CPU, all parts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.machine import outlasting

REPO = Path(__file__).resolve().parents[1]


BENCHMARK_S = 300.0
"""How long the benchmark may take here."""


@pytest.mark.slow  # a benchmark script end to end
@outlasting(BENCHMARK_S)
def test_grpo_step_benchmark_runs_tiny_and_reports_every_part(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    command = [sys.executable, "-m", "benchmarks.grpo_step", "--tiny", "--steps", "1", "--warmup", "1"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "2"}
    subprocess.run(
        [*command, "--json-out", str(out)],
        env=env,
        cwd=REPO,
        capture_output=True,
        timeout=BENCHMARK_S,
        check=True,
    )
    figures = json.loads(out.read_text())
    seconds = figures["seconds"]
    parts = ("rollout", "recompute", "reference", "update", "sync")
    assert set(seconds) == {*parts, "host", "step"}
    measured = sum(seconds[part] for part in parts)
    assert measured + seconds["host"] == pytest.approx(
        max(measured, seconds["step"]), abs=1e-3
    )  # host: the rest
    assert sum(figures["host_seconds"].values()) == pytest.approx(seconds["host"], abs=2e-4)
    assert seconds["recompute"] == 0.0, "one epoch of one mini-batch takes its old logprobs from the update"
    assert figures["episodes"] == 4 and figures["train_tokens"] == figures["losses"]["train/tokens"]
    assert figures["episodes_per_s"] == pytest.approx(figures["episodes"] / seconds["step"], abs=0.01)
    assert figures["train_tokens_per_s"] == pytest.approx(figures["train_tokens"] / seconds["step"], abs=0.1)
    assert figures["device"] == "cpu" and figures["peak_memory_gib"] >= 0.1  # torch alone holds more
    assert figures["engine_batches"] >= 3
    split = figures["episode_seconds"]
    assert set(split) == {"env", "env_reset", "generate", "queue", "tokenize", "total"}
    assert 0 < split["env_reset"] <= split["env"]
    assert split["total"] >= split["env"] + split["generate"] + split["tokenize"] - 1e-3  # one after another
    assert "train/pg_loss" in figures["losses"]
