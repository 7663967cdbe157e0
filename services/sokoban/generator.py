"""Procedural Sokoban levels, deterministic per seed, each verified solvable by the exact BFS.

A candidate has border walls, interior walls drawn with probability `wall_fraction`, then distinct
cells for the targets, the boxes and the player (the seed's recipe). It is kept when its optimal
solution length (primitive moves) lies within [min_moves, max_moves]. Every bound is counted in
search states, never in seconds, so a seed gives the same level on any machine.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from services.sokoban.game import FLOOR, TARGET, WALL, Level
from services.sokoban.solver import solve_bfs

MAX_ATTEMPTS = 2000
STATES_PER_ATTEMPT = 50_000
TOTAL_STATES = 1_000_000


class GenerationError(ValueError):
    """No level within the requested bounds was found inside the generator's search budget."""


@dataclass(frozen=True)
class GeneratedLevel:
    """A generated level and one of its optimal solutions."""

    level: Level
    solution: tuple[str, ...]


def generate_level(
    seed: int,
    shape: tuple[int, int] = (6, 6),
    num_boxes: int = 1,
    wall_fraction: float = 0.05,
    min_moves: int = 1,
    max_moves: int = 100,
) -> GeneratedLevel:
    """The level of `seed`: the first candidate of the seed's random stream that passes the BFS check."""
    rng = random.Random(seed)
    states_left = TOTAL_STATES
    for _ in range(MAX_ATTEMPTS):
        level = _candidate(rng, shape, num_boxes, wall_fraction)
        if level is None:
            continue
        result = solve_bfs(level, max_moves=max_moves, max_states=min(STATES_PER_ATTEMPT, states_left))
        states_left -= result.states
        if result.moves is not None and len(result.moves) >= min_moves:
            return GeneratedLevel(level, result.moves)
        if states_left <= 0:
            break
    raise GenerationError(
        f"seed {seed}: no solvable {shape[0]}x{shape[1]} level with {num_boxes} box(es) and an optimal "
        f"solution of {min_moves}..{max_moves} moves within the search budget; relax the bounds"
    )


def _candidate(
    rng: random.Random, shape: tuple[int, int], num_boxes: int, wall_fraction: float
) -> Level | None:
    """One random layout, or None when the interior walls leave too few free cells."""
    rows, cols = shape
    grid = [
        [
            WALL if r in (0, rows - 1) or c in (0, cols - 1) or rng.random() < wall_fraction else FLOOR
            for c in range(cols)
        ]
        for r in range(rows)
    ]
    free = [(r, c) for r in range(rows) for c in range(cols) if grid[r][c] == FLOOR]
    if len(free) < 2 * num_boxes + 1:
        return None
    cells = rng.sample(free, 2 * num_boxes + 1)
    for r, c in cells[:num_boxes]:
        grid[r][c] = TARGET
    return Level(tuple(map(tuple, grid)), frozenset(cells[num_boxes:-1]), cells[-1])
