"""`vistarl data geo3k`: the real Geometry3K layouts (the original folders, the parquet files), written
from generated problems, converted."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image
from typer.testing import CliRunner

from vistarl.cli.main import app
from vistarl.services.geo3k import Geo3kSample, build_env
from vistarl.services.geo3k.generator import GeneratedProblem, generate
from vistarl.services.geo3k.prompt import SYSTEM_PROMPT
from vistarl.services.geo3k.sample import LETTERS

HIYOUGA_SCHEMA = pa.schema(
    [
        ("images", pa.list_(pa.struct([("bytes", pa.binary()), ("path", pa.string())]))),
        ("problem", pa.string()),
        ("answer", pa.string()),
        ("id", pa.int64()),
        ("choices", pa.list_(pa.string())),
        ("ground_truth", pa.string()),
    ]
)


def png_bytes(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def multiple_choice(count: int, start: int) -> list[GeneratedProblem]:
    problems = (generate(seed) for seed in range(start, start + 50 * count))
    return [p for p in problems if p.choices][:count]


def write_hiyouga(root: Path, split: str, problems: list[GeneratedProblem]) -> None:
    """hiyouga/geometry3k's layout: data/<split>-00000-of-00001.parquet, images as {bytes, path} structs."""
    rows = [
        {
            "images": [{"bytes": png_bytes(p.image), "path": None}],
            "problem": p.problem,
            "answer": p.answer,
            "id": p.seed,
            "choices": p.choices,
            "ground_truth": LETTERS[p.choices.index(p.answer)] if p.choices else None,
        }
        for p in problems
    ]
    (root / "data").mkdir(parents=True, exist_ok=True)
    pq.write_table(
        pa.Table.from_pylist(rows, schema=HIYOUGA_SCHEMA), root / "data" / f"{split}-00000-of-00001.parquet"
    )


def write_processed(root: Path, problems: list[GeneratedProblem]) -> None:
    """The seed's processed layout: train.parquet with the instruction block before each problem; images as
    data URLs, bare base64 and a file path; plus one row with an unreadable image."""
    root.mkdir(parents=True, exist_ok=True)
    Path(root / "diagram.png").write_bytes(png_bytes(problems[2].image))
    encoded = [base64.b64encode(png_bytes(p.image)).decode() for p in problems]
    images = [[f"data:image/png;base64,{encoded[0]}"], [encoded[1]], ["diagram.png"], ["not an image"]]
    rows = [
        {"problem": SYSTEM_PROMPT + "\n\n" + p.problem, "answer": p.answer, "images": image}
        for p, image in zip(problems, images, strict=True)
    ]
    pq.write_table(pa.Table.from_pylist(rows), root / "train.parquet")


def convert(source: Path, out: Path) -> str:
    result = CliRunner().invoke(
        app, ["data", "geo3k", "--from", str(source), "--out", str(out)], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 0, result.output
    return result.output


def same_pixels(data_url: str, image: Image.Image) -> bool:
    decoded = Image.open(io.BytesIO(base64.b64decode(data_url.partition(",")[2])))
    return decoded.convert("RGB").tobytes() == image.convert("RGB").tobytes()


def test_hiyouga_layout_converts_split_by_split(tmp_path: Path) -> None:
    train, test = multiple_choice(5, 0), multiple_choice(3, 500)
    write_hiyouga(tmp_path / "src", "train", train)
    write_hiyouga(tmp_path / "src", "test", test)
    output = convert(tmp_path / "src", tmp_path / "out")
    assert "train: wrote 5 rows" in output and "test: wrote 3 rows" in output
    for split, problems in (("train", train), ("test", test)):
        frame = pd.read_parquet(tmp_path / "out" / f"{split}.parquet")
        assert list(frame.columns) == ["problem", "answer", "images", "choices", "id"]
        for row, problem in zip(frame.to_dict("records"), problems, strict=True):
            sample = Geo3kSample.model_validate(row)
            assert (sample.problem, sample.answer, sample.choices, sample.id) == (
                problem.problem,
                problem.answer,
                problem.choices,
                str(problem.seed),
            )
            assert same_pixels(sample.images[0], problem.image)
    env = build_env(sample=pd.read_parquet(tmp_path / "out" / "test.parquet").iloc[0].to_dict())
    obs, _ = env.reset()
    assert env.answer == test[0].answer and "Choices:" in obs["text"]


def test_processed_layout_drops_the_instruction_and_reads_every_image_form(tmp_path: Path) -> None:
    problems = [generate(seed) for seed in range(40, 44)]
    write_processed(tmp_path / "src", problems)
    output = convert(tmp_path / "src" / "train.parquet", tmp_path / "out")
    assert "train: wrote 3 rows" in output and "instruction block dropped from 3" in output
    assert "skipped 1" in output and "row 3" in output
    rows = pd.read_parquet(tmp_path / "out" / "train.parquet").to_dict("records")
    for row, problem in zip(rows, problems, strict=False):
        assert row["problem"] == problem.problem and row["answer"] == problem.answer
        assert same_pixels(row["images"][0], problem.image)


def write_folders(root: Path, split: str, problems: list[GeneratedProblem]) -> None:
    """The original distribution (Inter-GPS): SPLIT/ID/data.json with the answer as a letter, and
    img_diagram.png beside it (and other files, which are not read)."""
    for problem in problems:
        folder = root / split / str(problem.seed)
        folder.mkdir(parents=True)
        data = {
            "id": problem.seed,
            "problem_text": problem.problem.replace("<image>", ""),
            "choices": problem.choices,
            "answer": LETTERS[problem.choices.index(problem.answer)],
            "problem_type_graph": ["Triangle"],
            "compact_text": "unused",
        }
        (folder / "data.json").write_text(json.dumps(data))
        (folder / "img_diagram.png").write_bytes(png_bytes(problem.image))
        (folder / "logic_form.json").write_text("{}")


def test_the_original_folders_convert_split_by_split(tmp_path: Path) -> None:
    train, test = multiple_choice(3, 0), multiple_choice(2, 500)
    write_folders(tmp_path / "geometry3k", "train", train)
    write_folders(tmp_path / "geometry3k", "test", test)
    (tmp_path / "geometry3k" / "test" / str(test[1].seed) / "img_diagram.png").unlink()
    (tmp_path / "geometry3k" / "train" / "9999").mkdir()
    (tmp_path / "geometry3k" / "train" / "9999" / "data.json").write_text('{"problem": "x"}')
    output = " ".join(convert(tmp_path / "geometry3k", tmp_path / "out").split())
    assert "train: wrote 3 rows" in output and "test: wrote 1 rows" in output
    assert f"skipped {test[1].seed}/data.json: images: 'img_diagram.png' is neither base64 nor" in output
    assert "skipped 9999/data.json: data.json: expected an object with problem_text, choices" in output
    for split, problems in (("train", train), ("test", test[:1])):
        rows = pd.read_parquet(tmp_path / "out" / f"{split}.parquet").to_dict("records")
        for row, problem in zip(rows, problems, strict=True):
            sample = Geo3kSample.model_validate(row)
            assert sample.problem == "<image>" + problem.problem.replace("<image>", "")
            assert (sample.answer, sample.choices, sample.id) == (
                problem.answer,
                problem.choices,
                str(problem.seed),
            )
            assert same_pixels(sample.images[0], problem.image)


def test_a_source_without_the_columns_is_refused(tmp_path: Path) -> None:
    pq.write_table(pa.table({"question": ["x"]}), tmp_path / "train.parquet")
    result = CliRunner().invoke(
        app, ["data", "geo3k", "--from", str(tmp_path), "--out", str(tmp_path / "out")]
    )
    assert result.exit_code == 1 and "no column answer, images, problem" in " ".join(result.output.split())
