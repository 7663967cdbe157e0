"""Weights & Biases from a training run (`logging.wandb`): two scripted GRPO steps logged offline, with no
network, and read back from the run's own files: every metric of `metrics.jsonl` at its step, the config,
the reward curve and the sample trajectories with their images (docs/training.md, "Weights & Biases")."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from PIL import Image

from tests.test_train_loop import odd_seeds_count, scripted_config, with_changes
from tests.wandb_files import config, history
from vistarl.trainer.rollout.engines.scripted import ScriptedEngine
from vistarl.trainer.rollout.processor import VLProcessor
from vistarl.trainer.run.outputs import read_metrics
from vistarl.trainer.run.train import run_training


@pytest.fixture(autouse=True)
def wandb_away_from_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """W&B's own settings, cache and staging in the test's directory, and quiet."""
    for variable in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(variable, str(tmp_path / variable.lower()))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_MODE", raising=False)


async def test_an_offline_run_holds_the_metrics_config_curve_and_samples_of_two_steps(
    tiny_qwen25: Path, tmp_path: Path
) -> None:
    processor = VLProcessor.from_pretrained(tiny_qwen25)
    cfg = scripted_config(tiny_qwen25, tmp_path / "run", steps=2)
    cfg = with_changes(cfg, "train", save_samples=2)
    cfg = with_changes(cfg, "logging", wandb={"project": "tests", "name": "two-steps", "mode": "offline"})
    await run_training(cfg, engine=ScriptedEngine(processor, odd_seeds_count))

    (offline,) = (tmp_path / "run" / "wandb").glob("offline-run-*")
    (run_file,) = offline.glob("run-*.wandb")
    rows = history(run_file)
    jsonl = read_metrics(tmp_path / "run")
    assert [record["step"] for record in jsonl] == [1, 2]
    for record in jsonl:
        metrics = {key: value for key, value in record.items() if key not in ("step", "time")}
        assert {key: rows[record["step"]][key] for key in metrics} == metrics
    logged_config = config(run_file)
    assert {key: logged_config[key] for key in type(cfg).model_fields} == cfg.model_dump(mode="json")

    with (
        Image.open(offline / "files" / rows[2]["reward_curve/path"]) as curve,
        Image.open(tmp_path / "run" / "reward_curve.png") as drawn,
    ):
        assert curve.size == drawn.size
    for step in (1, 2):
        for index in (0, 1):
            images = rows[step][f"samples/{index}/images/filenames"]
            assert images and all((offline / "files" / name).is_file() for name in images)
            caption = rows[step][f"samples/{index}/images/captions"][0]
            assert re.fullmatch(r"\S+-s\d+-g\d+-s\d+: (COMPLETED|TRUNCATED), reward \S+, image 0", caption)
            with Image.open(offline / "files" / images[0]) as first:
                assert first.size == (8, 8)  # the counter env's observation image
            page = (offline / "files" / rows[step][f"samples/{index}/conversation/path"]).read_text()
            assert "<b>assistant</b>" in page and ("inc" in page or "wait" in page)
