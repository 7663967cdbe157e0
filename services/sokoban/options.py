"""The Sokoban env options (the `options` of `/reset`, the `**config` of `build_env`), validated once.

A level comes from exactly one source:
- generated from `seed` (the default): `grid_size`, `num_boxes`, `wall_fraction`, and the optimal
  solution length bounds `min_solution_len` / `max_solution_len` (which set the difficulty);
- `xsb`: a level as XSB text;
- `initial_base_grid` / `initial_boxes` / `initial_player`: the seed dataset's encoding, a list of rows
  of int codes (0 wall, 1 floor, 2 target), `[[row, col], ...]` and `[row, col]`;
- `boxoban`: `{"file": "hard_000", "index": 7}`, a level of a vendored Boxoban file.
A fixed level is parsed and checked here, so a bad one is a validation error naming its field.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator
from typing_extensions import Self

from vistarl.services.sokoban.boxoban import boxoban_file_name, boxoban_levels
from vistarl.services.sokoban.game import Level, LevelError
from vistarl.services.sokoban.generator import CELLS_PER_BOX, MAX_BOXES, limits

RenderMode = Literal["vision", "text", "both"]
GridSide = Annotated[int, Field(ge=5, le=10)]

MAX_LEVEL_SIDE = 32
_GENERATOR_ONLY = ("seed", "min_solution_len", "max_solution_len")
_CODE_FIELDS = ("initial_base_grid", "initial_boxes", "initial_player")


class BoxobanRef(BaseModel):
    """One level of a vendored Boxoban file."""

    model_config = ConfigDict(extra="forbid")

    file: str = Field(description="unfiltered_test_000, medium_valid_000 or hard_000 (with or without .txt).")
    index: int = Field(ge=0, description="Level number inside the file (0-based, as in its '; N' header).")

    @field_validator("file")
    @classmethod
    def _known_file(cls, value: str) -> str:
        return boxoban_file_name(value)

    @model_validator(mode="after")
    def _index_in_file(self) -> Self:
        count = len(boxoban_levels(self.file))
        if self.index >= count:
            raise ValueError(f"index {self.index} is out of range: {self.file} has {count} levels")
        return self


class SokobanOptions(BaseModel):
    """Where the level comes from, how it is shown, and the episode limits."""

    model_config = ConfigDict(extra="forbid")

    seed: int | None = Field(default=None, description="Generator seed; drawn at random when omitted.")
    grid_size: GridSide | tuple[GridSide, GridSide] = Field(
        default=6, description="Side (or [rows, cols]) of a generated level, border walls included."
    )
    num_boxes: int = Field(
        default=1,
        ge=1,
        le=MAX_BOXES,
        description="Boxes (and targets) of a generated level; at most one per 4 interior cells.",
    )
    wall_fraction: float = Field(
        default=0.05, ge=0.0, le=0.5, description="Chance of an interior wall per cell of a generated level."
    )
    min_solution_len: int = Field(
        default=1,
        ge=1,
        description="Fewest moves the optimal solution of a generated level may have (at most 5/4 of the "
        "interior's rows plus columns, less one per box after the first: 20 on 10x10 with one box).",
    )
    max_solution_len: int | None = Field(
        default=None,
        ge=1,
        description="Most moves the optimal solution of a generated level may have (default: max_steps; at "
        "least 5 per box after the first, plus one).",
    )
    xsb: str | None = Field(default=None, max_length=4096, description="A level as XSB text.")
    initial_base_grid: list[list[int]] | None = Field(
        default=None, description="A level's rows of codes: 0 wall, 1 floor, 2 target."
    )
    initial_boxes: list[list[int]] | None = Field(
        default=None, description="Box positions [[row, col], ...]."
    )
    initial_player: list[int] | None = Field(default=None, description="Player position [row, col].")
    boxoban: BoxobanRef | None = Field(default=None, description="A level of a vendored Boxoban file.")
    render_mode: RenderMode = Field(
        default="vision", description="vision: image only; text: XSB grid only; both."
    )
    cell_size: int = Field(
        default=64, ge=8, le=128, description="Pixels per grid cell (64 gives 384x384 for 6x6)."
    )
    max_steps: int = Field(
        default=100, ge=1, le=10_000, description="Primitive moves per episode, blocked ones included."
    )
    max_actions_per_turn: int = Field(default=3, ge=1, le=20, description="Moves taken from one response.")

    _fixed_level: Level | None = PrivateAttr(None)

    @field_validator("grid_size", *_CODE_FIELDS, mode="before")
    @classmethod
    def _plain_lists(cls, value: Any) -> Any:
        """Accept numpy arrays (as pandas gives for parquet list columns) by turning them into lists."""
        return _to_lists(value)

    @model_validator(mode="after")
    def _check_source(self) -> Self:
        self._check_one_source()
        loaded = self._load_fixed()
        if loaded is None:
            self._check_generator()
        else:
            source, self._fixed_level = loaded
            self._check_matches(self._fixed_level, source)
        return self

    @property
    def fixed_level(self) -> Level | None:
        """The level given by `xsb`, `initial_*` or `boxoban`; None when the level is generated."""
        return self._fixed_level

    @property
    def shape(self) -> tuple[int, int]:
        """(rows, cols) as given by `grid_size`."""
        return (self.grid_size, self.grid_size) if isinstance(self.grid_size, int) else self.grid_size

    @property
    def max_moves(self) -> int:
        """The longest optimal solution a generated level may have (never more than the step cap)."""
        return self.max_solution_len if self.max_solution_len is not None else self.max_steps

    def _check_one_source(self) -> None:
        """At most one level source; the three `initial_*` fields only together."""
        given_codes = [name for name in _CODE_FIELDS if getattr(self, name) is not None]
        missing = [name for name in _CODE_FIELDS if name not in given_codes]
        if given_codes and missing:
            raise ValueError(f"{', '.join(missing)}: required together with {', '.join(given_codes)}")
        sources = [name for name in ("xsb", "boxoban") if getattr(self, name) is not None] + given_codes[:1]
        if len(sources) > 1:
            raise ValueError(f"{' and '.join(sources)}: give at most one level source")

    def _load_fixed(self) -> tuple[str, Level] | None:
        """(source field, level) of the fixed level given, or None when the level is to be generated."""
        if self.xsb is not None:
            return "xsb", _parsed("xsb", functools.partial(Level.from_xsb, self.xsb))
        if self.boxoban is not None:
            return "boxoban", boxoban_levels(self.boxoban.file)[self.boxoban.index]
        if (
            self.initial_base_grid is not None
            and self.initial_boxes is not None
            and self.initial_player is not None
        ):
            codes = (self.initial_base_grid, self.initial_boxes, self.initial_player)
            return "initial_base_grid", _parsed(
                "initial_base_grid", functools.partial(Level.from_codes, *codes)
            )
        return None

    def _check_matches(self, level: Level, source: str) -> None:
        """Generator-only fields may not accompany a fixed level; grid_size / num_boxes must describe it."""
        for name in _GENERATOR_ONLY:
            if name in self.model_fields_set and getattr(self, name) is not None:
                raise ValueError(f"{name}: applies to generated levels only, not with {source}")
        if "grid_size" in self.model_fields_set and self.shape != level.shape:
            raise ValueError(
                f"grid_size: {list(self.shape)} does not match the {source} level's {list(level.shape)}"
            )
        if "num_boxes" in self.model_fields_set and self.num_boxes != len(level.boxes):
            raise ValueError(
                f"num_boxes: {self.num_boxes} does not match the {source} level's {len(level.boxes)}"
            )

    def _check_generator(self) -> None:
        """Refuse what no seed could meet: the bounds in order, and within the generator's `limits`."""
        if self.max_solution_len is not None and self.max_solution_len > self.max_steps:
            raise ValueError(
                f"max_solution_len: {self.max_solution_len} exceeds max_steps {self.max_steps}, "
                "so such a level could not be finished within the step cap"
            )
        if self.min_solution_len > self.max_moves:
            raise ValueError(
                f"min_solution_len: {self.min_solution_len} exceeds the upper bound {self.max_moves}"
            )
        rows, cols = self.shape
        bounds = limits(self.shape, self.num_boxes)
        if self.num_boxes > bounds.max_boxes:
            raise ValueError(
                f"num_boxes: a {rows}x{cols} grid holds at most {bounds.max_boxes} box(es) with room to "
                f"move ({(rows - 2) * (cols - 2)} interior cells, {CELLS_PER_BOX} per box); use fewer boxes "
                "or a larger grid_size"
            )
        if self.min_solution_len > bounds.longest_min_moves:
            raise ValueError(
                f"min_solution_len: {self.min_solution_len} is beyond what a {rows}x{cols} grid gives "
                f"every seed with {self.num_boxes} box(es) (at most {bounds.longest_min_moves} moves); lower "
                "it, or use fewer boxes or a larger grid_size (sides up to 10)"
            )
        if self.max_moves < bounds.shortest_max_moves:
            field = "max_solution_len" if self.max_solution_len is not None else "max_steps"
            raise ValueError(
                f"{field}: {self.max_moves} moves is too few for {self.num_boxes} boxes (a level needs "
                f"at least {bounds.shortest_max_moves}); raise {field} or use fewer boxes"
            )


def _parsed(source: str, parse: Callable[[], Level]) -> Level:
    """Parse a level given in field `source`; its errors, and a level too large to draw, name the field."""
    try:
        level = parse()
    except LevelError as exc:
        raise ValueError(f"{source}: {exc}") from None
    if max(level.shape) > MAX_LEVEL_SIDE:
        raise ValueError(
            f"{source}: the level is {level.shape[0]}x{level.shape[1]}, at most {MAX_LEVEL_SIDE}"
        )
    return level


def _to_lists(value: Any) -> Any:
    """Recursively turn array-likes with `.tolist()` into plain lists; leave everything else alone."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return [_to_lists(v) for v in value]
    return value
