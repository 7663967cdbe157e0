"""`vistarl data vsi` (VSI-Bench's question parquet into the project's test split), `vistarl vsi render`."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image
from typer.testing import CliRunner

from vistarl.cli.main import app
from vistarl.services.vsi import build_env
from vistarl.services.vsi.generator import generate_question
from vistarl.services.vsi.question import QuestionType

COLUMNS = ["id", "dataset", "scene_name", "question_type", "question", "ground_truth", "options"]


def vsibench_parquet(path: Path, rows: list[dict]) -> None:
    """A parquet laid out as VSI-Bench publishes its questions (options null for numeric rows)."""
    pq.write_table(pa.Table.from_pylist(rows), path)


def generated_rows() -> list[dict]:
    types = [
        QuestionType.OBJECT_COUNTING,
        QuestionType.OBJECT_REL_DIRECTION_HARD,
        QuestionType.ROUTE_PLANNING,
    ]
    rows = []
    for i, question_type in enumerate(types):
        row = generate_question(100 + i, "test", question_type=question_type).model_dump(mode="json")
        rows.append({**row, "id": 5000 + i})
    return rows


def test_vsibench_questions_import_and_play_in_the_rendered_rooms(tmp_path: Path) -> None:
    source = tmp_path / "vsibench.parquet"
    rows = generated_rows()
    vsibench_parquet(source, rows)
    result = CliRunner().invoke(app, ["data", "vsi", "--from", str(source), "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    table = pd.read_parquet(tmp_path / "out" / "test.parquet")
    assert list(table.columns) == COLUMNS and len(table) == len(rows)
    for (_, row), original in zip(table.iterrows(), rows, strict=True):
        env = build_env(sample=row.to_dict(), image_size=64)
        obs, info = env.reset()
        assert info["scene_name"] == original["scene_name"] and info["question_id"] == original["id"]
        assert original["question"] in obs["text"]
        answered = env.step(f"<answer>{original['ground_truth']}</answer>")
        assert answered.terminated and answered.info["episode_reward"] == 1.0


def test_a_bad_parquet_is_refused_naming_the_problem(tmp_path: Path) -> None:
    rows = generated_rows()
    missing = tmp_path / "missing.parquet"
    vsibench_parquet(missing, [{k: v for k, v in row.items() if k != "ground_truth"} for row in rows])
    result = CliRunner().invoke(app, ["data", "vsi", "--from", str(missing), "--out", str(tmp_path / "a")])
    assert result.exit_code == 1 and "ground_truth" in result.output
    unknown = tmp_path / "unknown.parquet"
    vsibench_parquet(unknown, [rows[0], {**rows[1], "scene_name": "scene9999_00"}])
    result = CliRunner().invoke(app, ["data", "vsi", "--from", str(unknown), "--out", str(tmp_path / "b")])
    assert result.exit_code == 1 and "row 1" in result.output and "scene9999_00" in result.output
    assert not (tmp_path / "b").exists()


def test_render_writes_the_tour_the_start_view_and_a_map(tmp_path: Path) -> None:
    args = [
        "vsi",
        "render",
        "--scene",
        "scene0684_01",
        "--out",
        str(tmp_path),
        "--size",
        "96",
        "--map-size",
        "200",
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["map.png", "start.png", *(f"tour_{k:02d}.png" for k in range(1, 9))]
    assert Image.open(tmp_path / "tour_01.png").size == (96, 96)
    assert Image.open(tmp_path / "map.png").size == (200, 200)
    bad = CliRunner().invoke(app, ["vsi", "render", "--scene", "nowhere", "--out", str(tmp_path)])
    assert bad.exit_code != 0 and "unknown scene" in bad.output
