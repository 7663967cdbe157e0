"""Task splits in the project's dataset format: parquet files of samples, one file per split, read lazily.

A dataset is a directory of `<split>.parquet` files (as `vistarl data ...` writes them) or one parquet
file whose stem names its split. Each row is one sample in an env's `sample_model` schema (JSON-safe
columns, images as PNG data URLs). `ParquetSplit` implements `vistarl.services.env_api.TaskSplit`: its length
comes from the file's metadata, and a row is read with the row group that holds it (the few groups read
last are kept), so a server can hold splits larger than its memory. pyarrow is imported with the first
split opened, so that a server serving none starts without it.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

GROUPS_KEPT = 4
SUFFIX = ".parquet"


class ParquetSplit:
    """The rows of one parquet file as a `TaskSplit`; safe to read from several threads."""

    def __init__(self, path: Path) -> None:
        import pyarrow.parquet as pq

        self.path = path
        self._file = pq.ParquetFile(path)
        sizes = [self._file.metadata.row_group(g).num_rows for g in range(self._file.num_row_groups)]
        self._starts = [0, *itertools.accumulate(sizes)]
        self._lock = threading.Lock()
        self._group = functools.lru_cache(maxsize=GROUPS_KEPT)(self._file.read_row_group)

    def __len__(self) -> int:
        return self._starts[-1]

    def __getitem__(self, index: int) -> dict[str, Any]:
        """Row `index` (from 0) as plain Python data."""
        if not 0 <= index < len(self):
            raise IndexError(f"row {index} is outside {self.path} ({len(self)} rows)")
        group = bisect.bisect_right(self._starts, index) - 1
        with self._lock:
            table: pa.Table = self._group(group)
        row: dict[str, Any] = table.slice(index - self._starts[group], 1).to_pylist()[0]
        return row


def load_splits(path: Path) -> dict[str, ParquetSplit]:
    """The splits of a dataset directory (`<split>.parquet` files) or of one parquet file, by name.

    Raises ValueError when `path` is neither, or a directory holds no parquet file.
    """
    if path.is_dir():
        files = sorted(path.glob(f"*{SUFFIX}"))
        if not files:
            raise ValueError(f"dataset directory {path} holds no {SUFFIX} files")
    elif path.is_file() and path.suffix == SUFFIX:
        files = [path]
    else:
        raise ValueError(f"dataset {path} is neither a directory of {SUFFIX} files nor a {SUFFIX} file")
    return {file.stem: ParquetSplit(file) for file in files}
