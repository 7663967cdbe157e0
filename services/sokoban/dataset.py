"""The Sokoban train/test parquet files, in the seed's "processed" schema.

Each row is one generated level:
- `prompt`: the first user turn, `<image>` followed by the observation text (no image in text mode);
- `images`: the first frame as PNG data URLs;
- `extra_info`: `split`, `index`, `seed`, `optimal_moves`, and `env_config` (`grid_size`, `num_boxes`,
  `render_mode`, `max_steps`, `wall_fraction`, `cell_size`, `max_actions_per_turn` and the level as
  `initial_base_grid` / `initial_boxes` / `initial_player`), so `build_env(sample=row)` replays it.

Seeds: the train split draws generator seeds 2·(S+k) and the test split 2·(S+k)+1 for k = 0, 1, ..., so the
two never share a seed whatever S and the sizes are. A candidate whose level already appeared (in
either split) is skipped, so no level is in both splits either; both facts are checked before writing.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from vistarl.clients.images import encode_image
from vistarl.services.sokoban.env import SokobanEnv
from vistarl.services.sokoban.options import SokobanOptions

IMAGE_PLACEHOLDER = "<image>"
SPLITS = {"train": 0, "test": 1}
CANDIDATES_PER_ROW = 20


class DatasetError(RuntimeError):
    """The requested dataset cannot be built (e.g. too few distinct levels for the sizes asked)."""


def split_seed(split: str, base_seed: int, k: int) -> int:
    """The k-th generator seed of a split: even for train, odd for test."""
    return 2 * (base_seed + k) + SPLITS[split]


def write_dataset(
    out_dir: Path,
    n_train: int,
    n_test: int,
    base_seed: int,
    options: SokobanOptions,
    on_row: Callable[[], None] | None = None,
) -> dict[str, Path]:
    """Generate both splits, check they are disjoint, and write `train.parquet` and `test.parquet`."""
    if options.fixed_level is not None:
        raise DatasetError("the dataset generates its levels: give generator options, not a fixed level")
    seen: set[str] = set()
    rows = {
        split: list(_rows(split, n, base_seed, options, seen, on_row))
        for split, n in (("train", n_train), ("test", n_test))
    }
    _check_disjoint(rows["train"], rows["test"])
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, split_rows in rows.items():
        paths[split] = out_dir / f"{split}.parquet"
        pq.write_table(pa.Table.from_pylist(split_rows), paths[split])
    return paths


def _rows(
    split: str,
    n: int,
    base_seed: int,
    options: SokobanOptions,
    seen: set[str],
    on_row: Callable[[], None] | None,
) -> Iterator[dict[str, Any]]:
    """Rows of one split from its seed sequence, skipping levels already in `seen` (which it extends)."""
    made = 0
    for k in range(CANDIDATES_PER_ROW * n):
        if made == n:
            return
        seed = split_seed(split, base_seed, k)
        env = SokobanEnv(options, seed)
        key = env.level.to_xsb()
        if key in seen:
            continue
        seen.add(key)
        yield _row(env, split, made)
        made += 1
        if on_row is not None:
            on_row()
    if made < n:
        raise DatasetError(
            f"{split}: only {made} distinct levels in {CANDIDATES_PER_ROW * n} seeds; "
            "ask for fewer rows or a larger or harder level space"
        )


def _row(env: SokobanEnv, split: str, index: int) -> dict[str, Any]:
    """One dataset row: the first observation as prompt and images, plus the env config that replays it."""
    obs, _ = env.reset()
    options = env.options
    env_config = {
        "grid_size": list(env.level.shape),
        "num_boxes": len(env.level.boxes),
        "render_mode": options.render_mode,
        "max_steps": options.max_steps,
        "wall_fraction": options.wall_fraction,
        "cell_size": options.cell_size,
        "max_actions_per_turn": options.max_actions_per_turn,
        **env.level.to_codes(),
    }
    placeholder = IMAGE_PLACEHOLDER + "\n" if obs["images"] else ""
    return {
        "data_source": "sokoban",
        "prompt": placeholder + obs["text"],
        "images": [encode_image(image) for image in obs["images"]],
        "extra_info": {
            "split": split,
            "index": index,
            "seed": env.seed,
            "optimal_moves": env.optimal_moves,
            "env_config": env_config,
        },
    }


def _check_disjoint(train: list[dict[str, Any]], test: list[dict[str, Any]]) -> None:
    """Refuse to write splits that share a generator seed or a level (a test-set leak)."""

    def seeds(rows: list[dict[str, Any]]) -> set[int]:
        return {row["extra_info"]["seed"] for row in rows}

    def levels(rows: list[dict[str, Any]]) -> set[str]:
        configs = (row["extra_info"]["env_config"] for row in rows)
        return {
            json.dumps([c["initial_base_grid"], c["initial_boxes"], c["initial_player"]]) for c in configs
        }

    if seeds(train) & seeds(test) or levels(train) & levels(test):
        raise DatasetError("train and test splits overlap; refusing to write a leaking dataset")
