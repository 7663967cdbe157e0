"""Converting the real Geometry3K into the project's dataset format (`vistarl data geo3k`).

Sources: the original distribution (the Inter-GPS release), folders `SPLIT/ID/` each holding
`data.json` (`problem_text`, `choices`, `answer` as the choice's letter, `id`; other keys are ignored)
and the diagram `img_diagram.png`; and parquet files, read by column name (other columns are ignored):
- hiyouga/geometry3k: `images` (a list of `{bytes, path}` image structs), `problem` ("<image>" and the
  text), `answer` (the correct choice's value), `id`, `choices`, `ground_truth` (the letter);
- the seed's `*_imgurl_processed` parquet (slime's geo3k example): `problem`, `answer`, `images`, where
  `problem` starts with an instruction block (the tool protocol) before the original text. The block
  is dropped, since the env's system prompt carries the protocol.
An image may be a `{bytes, path}` struct, raw bytes, a data URL, bare base64, or a file path (relative
to the parquet file); it is re-encoded as a PNG data URL. A URL to download is refused: nothing is
fetched. Files are grouped into splits by name (`train-00000-of-00001.parquet` and `train.parquet`
are both `train`; a problem folder's split is the folder above it), and each split is written to
`OUT/<split>.parquet`, one row per sample in the `Geo3kSample` schema. Rows that do not validate are
skipped and reported.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import functools
import io
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image
from pydantic import ValidationError

from vistarl.clients.images import encode_image
from vistarl.services.geo3k.sample import IMAGE_PLACEHOLDER, Geo3kSample

INSTRUCTION_MARKERS = ("calc_score", "<tool_call>")
FOLDER_DATA = "data.json"
FOLDER_DIAGRAM = "img_diagram.png"
FOLDER_KEYS = ("problem_text", "choices", "answer")
BATCH_ROWS = 256
SCHEMA = pa.schema(
    [
        ("problem", pa.string()),
        ("answer", pa.string()),
        ("images", pa.list_(pa.string())),
        ("choices", pa.list_(pa.string())),
        ("id", pa.string()),
    ]
)


class ConversionError(ValueError):
    """The source cannot be converted (no parquet files, or a file without the needed columns)."""


@dataclass
class SplitReport:
    """What one split's conversion did."""

    path: Path
    rows: int = 0
    instructions_dropped: int = 0
    skipped: list[str] = field(default_factory=list)


def source_files(source: Path) -> dict[str, list[Path]]:
    """The parquet files and problem folders' `data.json` of `source` (a file, or a directory searched
    recursively), by split name; problem folders in the order of their ids."""
    if source.is_file():
        files = [source]
    else:
        folders = sorted(source.rglob(FOLDER_DATA), key=lambda p: (p.parent.parent, len(p.parent.name), p))
        files = sorted(source.rglob("*.parquet")) + folders
    if not files:
        raise ConversionError(f"{source}: no parquet files, nor problem folders with a {FOLDER_DATA}")
    splits: dict[str, list[Path]] = {}
    for path in files:
        split = path.parent.parent.name if path.name == FOLDER_DATA else path.stem.split("-")[0]
        splits.setdefault(split, []).append(path)
    return splits


def count_rows(files: dict[str, list[Path]]) -> int:
    """Rows in all the files: a parquet file's from its footer, one per problem folder."""
    return sum(
        1 if path.name == FOLDER_DATA else pq.ParquetFile(path).metadata.num_rows
        for paths in files.values()
        for path in paths
    )


def convert(
    source: Path, out_dir: Path, on_rows: Callable[[int], None] | None = None
) -> dict[str, SplitReport]:
    """Convert every split of `source` into `out_dir/<split>.parquet`; `on_rows(n)` after each batch."""
    files = source_files(source)
    out_dir.mkdir(parents=True, exist_ok=True)
    reports = {}
    for split, paths in files.items():
        report = SplitReport(out_dir / f"{split}.parquet")
        with pq.ParquetWriter(report.path, SCHEMA) as writer:
            for batch in _converted_batches(paths, report):
                writer.write_table(pa.Table.from_pylist(batch, schema=SCHEMA))
                if on_rows is not None:
                    on_rows(len(batch))
        reports[split] = report
    return reports


Conversion = Callable[[], tuple[dict[str, Any], bool]]
"""One source row's conversion, run where its failure can be reported: `_sample_row`'s result."""


def _converted_batches(paths: list[Path], report: SplitReport) -> Iterator[list[dict[str, Any]]]:
    """Batches of converted rows (possibly empty, so progress still advances) from `paths`, in order."""
    for batch in _source_batches(paths):
        converted = []
        for where, conversion in batch:
            try:
                sample, dropped = conversion()
            except (ValidationError, ValueError, OSError) as exc:
                report.skipped.append(f"{where}: {_reason(exc)}")
            else:
                converted.append(sample)
                report.instructions_dropped += dropped
        report.rows += len(converted)
        yield converted


def _source_batches(paths: list[Path]) -> Iterator[list[tuple[str, Conversion]]]:
    """The rows of `paths` in batches, each named for the report and not yet converted."""
    index = 0
    for path in paths:
        if path.name == FOLDER_DATA:
            continue
        parquet = pq.ParquetFile(path)
        missing = {"problem", "answer", "images"} - set(parquet.schema_arrow.names)
        if missing:
            raise ConversionError(f"{path}: no column {', '.join(sorted(missing))}; is it Geometry3K?")
        for batch in parquet.iter_batches(batch_size=BATCH_ROWS):
            rows = batch.to_pylist()
            yield [
                (f"{path.name} row {index + i}", functools.partial(_sample_row, row, path.parent))
                for i, row in enumerate(rows)
            ]
            index += len(rows)
    folders = [path for path in paths if path.name == FOLDER_DATA]
    for start in range(0, len(folders), BATCH_ROWS):
        yield [
            (f"{path.parent.name}/{FOLDER_DATA}", functools.partial(_folder_row, path))
            for path in folders[start : start + BATCH_ROWS]
        ]


def _folder_row(path: Path) -> tuple[dict[str, Any], bool]:
    """One problem folder of the original distribution as a validated sample row: the diagram before the
    problem text, the choices, and the answer's letter (read as that choice)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or not all(key in data for key in FOLDER_KEYS):
        raise ValueError(
            f"{FOLDER_DATA}: expected an object with {', '.join(FOLDER_KEYS)}; is it Geometry3K?"
        )
    row = {
        "problem": IMAGE_PLACEHOLDER + str(data["problem_text"]),
        "answer": str(data["answer"]),
        "images": [FOLDER_DIAGRAM],
        "choices": [str(choice) for choice in data["choices"] or []],
        "id": data.get("id", path.parent.name),
    }
    return _sample_row(row, path.parent)


def _sample_row(row: dict[str, Any], base: Path) -> tuple[dict[str, Any], bool]:
    """One source row as a validated sample row, and whether an instruction block was dropped from it."""
    problem = str(row["problem"])
    start = problem.find(IMAGE_PLACEHOLDER)
    dropped = start > 0 and any(marker in problem[:start] for marker in INSTRUCTION_MARKERS)
    if dropped:
        problem = problem[start:]
    choices = row.get("choices")
    sample = Geo3kSample.model_validate(
        {
            "problem": problem,
            "answer": str(row["answer"]),
            "images": [_data_url(item, base) for item in row["images"] or []],
            "choices": list(choices) if choices else None,
            "id": None if row.get("id") is None else str(row["id"]),
        }
    )
    return sample.model_dump(mode="json"), dropped


def _data_url(item: Any, base: Path) -> str:
    """One image of a source row as a PNG data URL."""
    if isinstance(item, dict):
        item = item.get("bytes") or item.get("path")
    if isinstance(item, str):
        item = _image_bytes(item, base)
    if not isinstance(item, bytes):
        raise ValueError(f"images: unsupported image value of type {type(item).__name__}")
    try:
        with Image.open(io.BytesIO(item)) as image:
            return encode_image(image.convert("RGB"))
    except OSError as exc:
        raise ValueError(f"images: not a readable image: {exc}") from None


def _image_bytes(text: str, base: Path) -> bytes:
    """The bytes behind an image string: a data URL, bare base64, or a file path."""
    if text.startswith(("http://", "https://")):
        raise ValueError(f"images: {text[:60]} is a URL; nothing is downloaded, give the image itself")
    if text.startswith("data:"):
        text = text.partition(",")[2]
    else:
        with contextlib.suppress(OSError):
            return (base / text).read_bytes()
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"images: {text[:60]!r} is neither base64 nor an existing file") from None


def _reason(exc: Exception) -> str:
    """A one-line reason: the first validation error with its field, or the message."""
    if isinstance(exc, ValidationError):
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"]) or "row"
        return f"{where}: {error['msg']}"
    return str(exc)
