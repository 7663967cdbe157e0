"""VSI-Bench's published questions as the project's VSI data set: `DIR/test.parquet` of `VsiQuestion` rows.

VSI-Bench's parquet has the columns `id`, `dataset`, `scene_name`, `question_type`, `question`,
`ground_truth` and `options`; every row is validated (its scene must be one of the vendored layouts)
and written with exactly those columns, so `build_env(sample=row)` or `/reset`'s `sample` plays it in
the rendered room.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import ValidationError

from vistarl.services.vsi.question import VsiQuestion

COLUMNS = ("id", "dataset", "scene_name", "question_type", "question", "ground_truth", "options")
SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("dataset", pa.string()),
        ("scene_name", pa.string()),
        ("question_type", pa.string()),
        ("question", pa.string()),
        ("ground_truth", pa.string()),
        ("options", pa.list_(pa.string())),
    ]
)


class DatasetError(ValueError):
    """The source parquet lacks a column or holds a row that is not a valid VSI question."""


def read_questions(source: Path) -> list[VsiQuestion]:
    """Every row of a VSI-Bench parquet file as a validated question; errors name the row."""
    table = pq.read_table(source)
    missing = [column for column in COLUMNS if column not in table.column_names]
    if missing:
        raise DatasetError(
            f"{source}: missing column(s) {', '.join(missing)} (has {', '.join(table.column_names)})"
        )
    questions = []
    for index, row in enumerate(table.select(list(COLUMNS)).to_pylist()):
        row["ground_truth"] = str(row["ground_truth"])
        try:
            questions.append(VsiQuestion.model_validate(row))
        except ValidationError as exc:
            raise DatasetError(f"{source}: row {index} (id {row['id']}): {exc}") from None
    return questions


def write_questions(questions: list[VsiQuestion], out_dir: Path, split: str = "test") -> Path:
    """Write questions as `out_dir/{split}.parquet` in the `VsiQuestion` columns."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = [question.model_dump(mode="json") for question in questions]
    path = out_dir / f"{split}.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), path)
    return path


def import_vsibench(source: Path, out_dir: Path) -> tuple[Path, int]:
    """Read VSI-Bench's parquet and write it as the project's test split; (path written, rows)."""
    questions = read_questions(source)
    return write_questions(questions, out_dir), len(questions)
