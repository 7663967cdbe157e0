"""A checkpoint of one architecture under a config of the other is refused wherever a checkpoint is loaded:
`ModelConfig.check_arch`, and through it `vistarl train` and `vistarl engine serve --arch` (`vistarl up`
refuses it before anything starts: tests/test_up_preflight.py). Unchecked, a Qwen2.5-VL checkpoint trains
under a Qwen3-VL config with nothing to say the two disagree."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from vistarl.devtools.servers import vistarl_cmd
from vistarl.trainer.config import ConfigError, ModelConfig

ROOT = Path(__file__).resolve().parents[1]


def test_the_checkpoints_model_type_must_be_the_configs_arch(
    tiny_qwen25: Path, tiny_qwen3: Path, tmp_path: Path
) -> None:
    ModelConfig(path=str(tiny_qwen25), arch="qwen2_5_vl").check_arch()
    ModelConfig(path=str(tiny_qwen3), arch="auto").check_arch()  # auto takes either
    with pytest.raises(ConfigError, match=r"holds a qwen3_vl checkpoint .* but model.arch is qwen2_5_vl"):
        ModelConfig(path=str(tiny_qwen3), arch="qwen2_5_vl").check_arch()
    with pytest.raises(ConfigError, match="is not a checkpoint directory"):
        ModelConfig(path=str(tmp_path), arch="auto").check_arch()


def run(*args: str) -> subprocess.CompletedProcess[str]:
    """A `vistarl` command run to its end, its output captured."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.run(vistarl_cmd(*args), capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)


def test_train_refuses_a_checkpoint_of_another_architecture(tiny_qwen25: Path, tmp_path: Path) -> None:
    config = str(ROOT / "configs" / "sokoban_tiny.yaml")  # arch: qwen2_5_vl
    done = run(
        "train", "--config", config, "--set", f"model.path={tiny_qwen25}", "--set", "model.arch=qwen3_vl",
        "--set", f"train.run_dir={tmp_path / 'run'}",
    )  # fmt: skip
    said = " ".join(done.stdout.split())
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"training failed: {tiny_qwen25} holds a qwen2_5_vl checkpoint" in said
    assert "but model.arch is qwen3_vl" in said
    assert not (tmp_path / "run").exists()  # refused before the run began


def test_engine_serve_refuses_a_checkpoint_of_another_architecture(tiny_qwen3: Path) -> None:
    done = run("engine", "serve", "--model", str(tiny_qwen3), "--arch", "qwen2_5_vl", "--port", "1")
    assert done.returncode == 2, done.stderr
    said = " ".join(done.stderr.replace("│", " ").split())
    assert "holds a qwen3_vl checkpoint (its config.json's model_type), but --arch is qwen2_5_vl" in said
