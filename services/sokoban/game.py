"""Sokoban rules: the level (static grid + initial boxes and player), moves with per-move rewards, XSB I/O.

The base grid uses the seed's integer codes: 0 wall, 1 floor, 2 target. Positions are `(row, col)`.
A level is a text in XSB notation: `#` wall, space (or `-`/`_`) floor, `.` target, `$` box,
`*` box on target, `@` player, `+` player on target, one line per row.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

WALL, FLOOR, TARGET = 0, 1, 2

Pos = tuple[int, int]

DIRECTIONS: dict[str, Pos] = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}

# Per-move rewards (seed rules). A push from one target to another earns both the placement and the
# removal terms, as in the seed: +1.0 - 0.5 + 0.01.
REWARD_EFFECTIVE_MOVE = 0.01
REWARD_BOX_ON_TARGET = 1.0
REWARD_BOX_OFF_TARGET = -0.5
REWARD_BLOCKED = -0.05

_XSB_FLOOR = {" ", "-", "_"}
_XSB_CODES = {"#": WALL, ".": TARGET, "*": TARGET, "+": TARGET, "$": FLOOR, "@": FLOOR} | dict.fromkeys(
    _XSB_FLOOR, FLOOR
)


class LevelError(ValueError):
    """A level that breaks the rules: bad characters or codes, ragged rows, misplaced boxes or player."""


@dataclass(frozen=True)
class Level:
    """An immutable Sokoban level: the base grid of wall/floor/target codes, the boxes and the player."""

    grid: tuple[tuple[int, ...], ...]
    boxes: frozenset[Pos]
    player: Pos

    def __post_init__(self) -> None:
        _check_level(self.grid, self.boxes, self.player)

    @classmethod
    def from_codes(
        cls, grid: Sequence[Sequence[int]], boxes: Iterable[Sequence[int]], player: Sequence[int]
    ) -> Level:
        """Build a level from the seed's encoding: int-code rows, `[[r, c], ...]` boxes, `[r, c]` player."""
        box_list = [_pos(b, "box") for b in boxes]
        box_set = frozenset(box_list)
        if len(box_set) != len(box_list):
            raise LevelError("two boxes share a cell")
        return cls(tuple(tuple(int(v) for v in row) for row in grid), box_set, _pos(player, "player"))

    @classmethod
    def from_xsb(cls, text: str) -> Level:
        """Parse an XSB level; rows shorter than the widest are padded with floor on the right."""
        lines = text.strip("\r\n").splitlines()
        if not any(line.strip() for line in lines):
            raise LevelError("empty level")
        width = max(len(line) for line in lines)
        grid: list[tuple[int, ...]] = []
        boxes: set[Pos] = set()
        players: list[Pos] = []
        for r, line in enumerate(lines):
            for c, ch in enumerate(line):
                if ch not in _XSB_CODES:
                    raise LevelError(f"row {r} col {c}: unknown character {ch!r}")
                if ch in "$*":
                    boxes.add((r, c))
                elif ch in "@+":
                    players.append((r, c))
            grid.append(tuple(_XSB_CODES[ch] for ch in line.ljust(width)))
        if len(players) != 1:
            raise LevelError(f"a level needs exactly one player ('@' or '+'), found {len(players)}")
        return cls(tuple(grid), frozenset(boxes), players[0])

    @property
    def shape(self) -> tuple[int, int]:
        """(rows, cols) of the grid."""
        return len(self.grid), len(self.grid[0])

    @property
    def targets(self) -> frozenset[Pos]:
        """Every target cell."""
        return frozenset((r, c) for r, row in enumerate(self.grid) for c, v in enumerate(row) if v == TARGET)

    def to_xsb(self) -> str:
        """The initial state as XSB text."""
        return render_xsb(self.grid, self.boxes, self.player)

    def to_codes(self) -> dict[str, list[list[int]] | list[int]]:
        """The seed's `initial_base_grid` / `initial_boxes` / `initial_player` encoding (JSON-ready)."""
        return {
            "initial_base_grid": [list(row) for row in self.grid],
            "initial_boxes": [list(b) for b in sorted(self.boxes)],
            "initial_player": list(self.player),
        }


@dataclass(frozen=True)
class MoveResult:
    """The outcome of one primitive move: whether the player moved, and the move's reward."""

    moved: bool
    reward: float


class Game:
    """The mutable state of one episode: where the boxes and the player are now."""

    def __init__(self, level: Level) -> None:
        self.level = level
        self.boxes: set[Pos] = set(level.boxes)
        self.player: Pos = level.player

    def move(self, direction: str) -> MoveResult:
        """Apply one primitive move ('up', 'down', 'left', 'right'); a blocked move changes nothing."""
        dr, dc = DIRECTIONS[direction]
        r, c = self.player
        nxt = (r + dr, c + dc)
        if not self._is_open(nxt):
            return MoveResult(False, REWARD_BLOCKED)
        reward = REWARD_EFFECTIVE_MOVE
        if nxt in self.boxes:
            dest = (nxt[0] + dr, nxt[1] + dc)
            if not self._is_open(dest) or dest in self.boxes:
                return MoveResult(False, REWARD_BLOCKED)
            self.boxes.remove(nxt)
            self.boxes.add(dest)
            if self._is_target(dest):
                reward += REWARD_BOX_ON_TARGET
            if self._is_target(nxt):
                reward += REWARD_BOX_OFF_TARGET
        self.player = nxt
        return MoveResult(True, reward)

    def play(self, moves: Iterable[str]) -> bool:
        """Apply moves in order (blocked ones change nothing); True if the level ends solved."""
        for direction in moves:
            self.move(direction)
        return self.solved

    @property
    def solved(self) -> bool:
        """True when every box stands on a target."""
        return all(self._is_target(b) for b in self.boxes)

    def to_xsb(self) -> str:
        """The current state as XSB text."""
        return render_xsb(self.level.grid, self.boxes, self.player)

    def _is_open(self, pos: Pos) -> bool:
        rows, cols = self.level.shape
        r, c = pos
        return 0 <= r < rows and 0 <= c < cols and self.level.grid[r][c] != WALL

    def _is_target(self, pos: Pos) -> bool:
        return self.level.grid[pos[0]][pos[1]] == TARGET


def render_xsb(grid: Sequence[Sequence[int]], boxes: Iterable[Pos], player: Pos) -> str:
    """Write a state as XSB text, one line per row (trailing floor is kept so rows stay aligned)."""
    chars = [["#" if v == WALL else "." if v == TARGET else " " for v in row] for row in grid]
    for r, c in boxes:
        chars[r][c] = "*" if grid[r][c] == TARGET else "$"
    pr, pc = player
    chars[pr][pc] = "+" if grid[pr][pc] == TARGET else "@"
    return "\n".join("".join(row) for row in chars)


def _pos(value: Sequence[int], what: str) -> Pos:
    if len(value) != 2:
        raise LevelError(f"a {what} position must be [row, col], got {list(value)!r}")
    return int(value[0]), int(value[1])


def _check_level(grid: tuple[tuple[int, ...], ...], boxes: frozenset[Pos], player: Pos) -> None:
    """Raise `LevelError` unless the grid is a non-empty rectangle of valid codes with a playable state."""
    if not grid or not grid[0]:
        raise LevelError("the grid is empty")
    width = len(grid[0])
    for r, row in enumerate(grid):
        if len(row) != width:
            raise LevelError(f"row {r} has {len(row)} cells, expected {width}")
        bad = [v for v in row if v not in (WALL, FLOOR, TARGET)]
        if bad:
            raise LevelError(f"row {r} has code {bad[0]!r}; codes are 0 wall, 1 floor, 2 target")

    def on_floor(pos: Pos) -> bool:
        r, c = pos
        return 0 <= r < len(grid) and 0 <= c < width and grid[r][c] != WALL

    if not on_floor(player):
        raise LevelError(f"the player at {list(player)} is outside the grid or on a wall")
    for box in sorted(boxes):
        if not on_floor(box):
            raise LevelError(f"the box at {list(box)} is outside the grid or on a wall")
    if player in boxes:
        raise LevelError(f"the player and a box share {list(player)}")
    n_targets = sum(v == TARGET for row in grid for v in row)
    if not boxes or len(boxes) != n_targets:
        raise LevelError(
            f"a level needs as many boxes as targets (at least one): {len(boxes)} boxes, {n_targets} targets"
        )
