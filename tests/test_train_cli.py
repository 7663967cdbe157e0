"""`vistarl train` end to end on the embedded stack: one step of the tiny Sokoban config, as users run it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from PIL import Image
from typer.testing import CliRunner

from cli.main import app
from tests.servers import vistarl_cmd

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "sokoban_tiny.yaml"


def test_one_step_of_the_tiny_sokoban_config_leaves_a_complete_run_directory(
    tiny_qwen25: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    overrides = [
        f"model.path={tiny_qwen25}",
        f"train.run_dir={run_dir}",
        "train.steps=1",
        "log.tensorboard=true",
    ]
    command = vistarl_cmd("train", "--config", str(CONFIG), *(arg for o in overrides for arg in ("--set", o)))
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert str(run_dir) in done.stdout

    (record,) = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert record["step"] == 1 and record["policy_version"] == 1.0
    assert record["rollout/episodes"] == 8.0 and record["rollout/missing"] == 0.0
    for key in ("reward/mean", "train/logprob_abs_diff", "train/grad_norm", "train/entropy", "time/rollout"):
        assert key in record
    assert record["train/logprob_abs_diff"] < 1e-3, "the embedded engine and the trainer disagree"

    with Image.open(run_dir / "reward_curve.png") as curve:
        assert curve.width > 100
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    samples = sorted((run_dir / "samples" / "step-000001").iterdir())
    assert len(samples) == 2
    sample = json.loads((samples[0] / "trajectory.json").read_text())
    assert sample["images"] and all((samples[0] / name).is_file() for name in sample["images"])
    checkpoint = run_dir / "checkpoints" / "step-000001"
    assert (checkpoint / "actor" / "model.safetensors").is_file()
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "step-000001"


def test_a_bad_override_is_a_usage_error_naming_the_key() -> None:
    result = CliRunner().invoke(app, ["train", "--config", str(CONFIG), "--set", "train.stepz=1"])
    assert result.exit_code == 2
    assert "train.stepz" in result.output and "steps" in result.output
