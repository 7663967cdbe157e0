"""The Sokoban parquet dataset: schema, disjoint splits, and rows that replay their level."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from vistarl.cli.main import app
from vistarl.clients.images import decode_image
from vistarl.services.sokoban import SokobanEnv, SokobanOptions, build_env
from vistarl.services.sokoban.dataset import DatasetError, split_seed, write_dataset
from vistarl.services.sokoban.game import Level


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict]]:
    out = tmp_path_factory.mktemp("sokoban-data")
    paths = write_dataset(out, n_train=12, n_test=6, base_seed=3, options=SokobanOptions())
    assert paths == {"train": out / "train.parquet", "test": out / "test.parquet"}
    return {split: pq.read_table(path).to_pylist() for split, path in paths.items()}


def test_rows_follow_the_processed_schema(dataset: dict[str, list[dict]]) -> None:
    assert len(dataset["train"]) == 12 and len(dataset["test"]) == 6
    for row in dataset["train"] + dataset["test"]:
        assert row["prompt"].startswith("<image>\n[Observation]\n")
        (url,) = row["images"]
        assert url.startswith("data:image/png;base64,")
        assert decode_image(url).size == (384, 384)
        config = row["extra_info"]["env_config"]
        assert {"grid_size", "num_boxes", "render_mode", "max_steps", "wall_fraction"} <= config.keys()
        assert {"initial_base_grid", "initial_boxes", "initial_player"} <= config.keys()


def test_rows_replay_their_level(dataset: dict[str, list[dict]]) -> None:
    for row in dataset["train"] + dataset["test"]:
        config = row["extra_info"]["env_config"]
        env = build_env(sample=row)
        stored = Level.from_codes(
            config["initial_base_grid"], config["initial_boxes"], config["initial_player"]
        )
        assert env.level == stored == SokobanEnv(SokobanOptions(), row["extra_info"]["seed"]).level
        obs, _ = env.reset()
        stored_image = decode_image(row["images"][0]).convert("RGB")
        assert stored_image.tobytes() == obs["images"][0].convert("RGB").tobytes()


def test_splits_share_no_seed_and_no_level(dataset: dict[str, list[dict]]) -> None:
    def seeds(split: str) -> set[int]:
        return {row["extra_info"]["seed"] for row in dataset[split]}

    def levels(split: str) -> set[str]:
        return {build_env(sample=row).render_text() for row in dataset[split]}

    assert all(s % 2 == 0 for s in seeds("train")) and all(s % 2 == 1 for s in seeds("test"))
    assert not seeds("train") & seeds("test")
    assert len(levels("train")) == 12 and len(levels("test")) == 6
    assert not levels("train") & levels("test")


def test_split_seed_ranges_never_meet() -> None:
    train = {split_seed("train", base, k) for base in range(5) for k in range(50)}
    test = {split_seed("test", base, k) for base in range(5) for k in range(50)}
    assert not train & test


def test_pandas_rows_work_too(tmp_path: Path) -> None:
    import pandas as pd  # the dev extra's; imported here, as only this test reads with it

    paths = write_dataset(tmp_path, 2, 1, 0, SokobanOptions(render_mode="text"))
    frame = pd.read_parquet(paths["train"])
    row = frame.iloc[0].to_dict()
    assert row["prompt"].startswith("[Observation]\n#") and len(row["images"]) == 0
    assert build_env(sample=row).level == SokobanEnv(SokobanOptions(), row["extra_info"]["seed"]).level


def test_too_few_distinct_levels_is_a_clear_error(tmp_path: Path) -> None:
    one_move = SokobanOptions(grid_size=5, wall_fraction=0.0, max_solution_len=1)
    with pytest.raises(DatasetError, match="distinct levels"):
        write_dataset(tmp_path, 13, 0, 0, one_move)
    assert not (tmp_path / "train.parquet").exists()


def test_fixed_level_options_are_refused(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="generator options"):
        write_dataset(tmp_path, 1, 1, 0, SokobanOptions(xsb="#####\n#@$.#\n#####"))


def test_cli_writes_both_files(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["data", "sokoban", "--out", str(tmp_path), "--n-train", "3", "--n-test", "2", "--seed", "7"]
    )
    assert result.exit_code == 0, result.output
    assert pq.read_table(tmp_path / "train.parquet").num_rows == 3
    assert pq.read_table(tmp_path / "test.parquet").num_rows == 2
    bad = CliRunner().invoke(app, ["data", "sokoban", "--out", str(tmp_path), "--num-boxes", "9"])
    assert bad.exit_code != 0 and "num_boxes" in bad.output
