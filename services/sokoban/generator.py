"""Procedural Sokoban levels by reverse play: any seed of a valid config gives one, deterministically.

A candidate is a random room and a reverse walk from its solved state (`reverse_play.py`), so every
state on the walk is solvable, and a state's optimal solution is at most one move longer than the
state before it. The exact search (`solve_optimal`) gives a state's optimal length in primitive
moves. Probes along the walk look for a state whose length lies in [min_moves, max_moves]: first the
state where every box has just left its target (a walk already too hard there is dropped), then a
random later state, then bisection between too short (earlier) and too long or too costly to solve
(later). Since lengths grow by at most one per reverse move, bisection between a state that is too
short and one that is too long always meets the window. A candidate that fits nowhere gives way to
the next one drawn from the same seed.

Every bound counts search states, never seconds, so a seed gives the same level on any machine; the
`limits` below are what every seed of a config can count on (docs/sokoban.md, "Generated levels").
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from vistarl.services.sokoban.game import Level
from vistarl.services.sokoban.reverse_play import Walk, reverse_walk, room
from vistarl.services.sokoban.solver import solve_optimal

MAX_BOXES = 4
CELLS_PER_BOX = 4
STATES_PER_SOLVE = 4_000
STATES_PER_CANDIDATE = 100
TOTAL_STATES = 1_000_000


@dataclass(frozen=True)
class GeneratedLevel:
    """A generated level, one of its optimal solutions, and the search states spent to find it."""

    level: Level
    solution: tuple[str, ...]
    states: int


class GenerationError(RuntimeError):
    """No level fitted the generator's budget: for a config within `limits` this is a bug, not bad input."""


@dataclass(frozen=True)
class Limits:
    """What a grid and box count can ask of the generator and still get a level for every seed."""

    max_boxes: int
    """Boxes the grid holds with room to pull them: one per `CELLS_PER_BOX` interior cells, at most 4."""
    longest_min_moves: int
    """The largest `min_moves`: 5/4 of the interior's rows plus columns, less one per box after the
    first (20 on 10x10 with 1 box, 17 with 4; 10 on 6x6 with 1 box)."""
    shortest_max_moves: int
    """The smallest `max_moves`: 5 per box after the first, plus one (16 for 4 boxes)."""


def limits(shape: tuple[int, int], num_boxes: int) -> Limits:
    """The generator's promises for `shape` (border walls included) and `num_boxes`, as measured by
    `benchmarks/sokoban_generation.py --limits` over every wall fraction."""
    inner_rows, inner_cols = shape[0] - 2, shape[1] - 2
    return Limits(
        max_boxes=min(MAX_BOXES, inner_rows * inner_cols // CELLS_PER_BOX),
        longest_min_moves=5 * (inner_rows + inner_cols) // 4 - (num_boxes - 1),
        shortest_max_moves=5 * (num_boxes - 1) + 1,
    )


def generate_level(
    seed: int,
    shape: tuple[int, int] = (6, 6),
    num_boxes: int = 1,
    wall_fraction: float = 0.05,
    min_moves: int = 1,
    max_moves: int = 100,
    max_states: int = TOTAL_STATES,
) -> GeneratedLevel:
    """The level of `seed`: a state of the first candidate in the seed's random stream that fits;
    `GenerationError` once `max_states` search states are spent without one."""
    rng = random.Random(seed)
    budget = _Budget(max_states)
    while budget.spent < budget.total:
        budget.spent += STATES_PER_CANDIDATE
        open_cells = room(rng, shape, wall_fraction, min_floor=3 * num_boxes + 3)
        walk = reverse_walk(rng, shape, open_cells, num_boxes, runs=rng.randint(num_boxes, 4 * num_boxes))
        found = _fitting_state(walk, budget, rng, min_moves, max_moves) if walk is not None else None
        if found is not None:
            return found
    raise GenerationError(
        f"seed {seed}: no {shape[0]}x{shape[1]} level with {num_boxes} box(es) and an optimal solution of "
        f"{min_moves}..{max_moves} moves within the search budget"
    )


class _Budget:
    """The search states one `generate_level` call has spent, out of `total`."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.spent = 0

    def solve(self, walk: Walk, index: int, max_moves: int) -> GeneratedLevel | None:
        """The walk's state `index` with an optimal solution, or None when that is longer than
        `max_moves` or costs more than `STATES_PER_SOLVE` (or the states left) to find."""
        level = walk.level(index)
        limit = min(STATES_PER_SOLVE, self.total - self.spent)
        result = solve_optimal(level, max_moves=max_moves, max_states=limit)
        self.spent += result.states
        return None if result.moves is None else GeneratedLevel(level, result.moves, self.spent)


def _fitting_state(
    walk: Walk, budget: _Budget, rng: random.Random, min_moves: int, max_moves: int
) -> GeneratedLevel | None:
    """A state of the walk whose optimal length lies in [min_moves, max_moves], or None."""
    lo, hi = walk.first_unsolved, len(walk.states) - 1
    first = budget.solve(walk, lo, max_moves)
    if first is None:
        return None
    fallback = first if len(first.solution) >= min_moves else None
    index = rng.randint(lo, hi)
    while lo < index:
        found = budget.solve(walk, index, max_moves)
        if found is not None and len(found.solution) >= min_moves:
            return found
        if found is None:
            hi = index - 1
        else:
            lo = index
        index = (lo + hi + 1) // 2
    return fallback
