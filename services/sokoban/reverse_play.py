"""Reverse play: a random room, then boxes pulled away from their targets, so every state is solvable.

A walk starts from a solved state (every box on its target, the player on a random free cell) and
applies reverse moves: the player walks, or pulls the box in front of it one cell while stepping
back. Each reverse move undoes one forward move, so pushing back along the walk solves every state
it passes, and a state's optimal solution is at most one move longer than the state before it
(docs/sokoban.md, "Generated levels"). Boxes are never pulled onto a target, so once every box has
been pulled once, every later state has all boxes off the targets, as in the seed's levels.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass

from vistarl.services.sokoban.game import FLOOR, TARGET, WALL, Level


@dataclass(frozen=True)
class Walk:
    """A room, its targets, and the states (player, boxes) of one reverse walk, on flat cell indices."""

    grid: tuple[tuple[int, ...], ...]
    states: tuple[tuple[int, frozenset[int]], ...]
    first_unsolved: int
    """Index of the first state with every box off the targets; every later state has that too."""

    def level(self, index: int) -> Level:
        """The walk's state `index` as a level."""
        player, boxes = self.states[index]
        cols = len(self.grid[0])
        return Level(self.grid, frozenset(divmod(b, cols) for b in boxes), divmod(player, cols))


def room(rng: random.Random, shape: tuple[int, int], wall_fraction: float, min_floor: int) -> bytearray:
    """Open cells of a room with border walls: each interior cell becomes a wall with probability
    `wall_fraction`, unless that would split the floor or leave fewer than `min_floor` cells."""
    rows, cols = shape
    open_cells = bytearray(rows * cols)
    interior = [r * cols + c for r in range(1, rows - 1) for c in range(1, cols - 1)]
    for cell in interior:
        open_cells[cell] = True
    floor = len(interior)
    for cell in interior:
        if rng.random() < wall_fraction and floor > min_floor:
            open_cells[cell] = False
            if _connected(open_cells, cols, floor - 1):
                floor -= 1
            else:
                open_cells[cell] = True
    return open_cells


def reverse_walk(
    rng: random.Random, shape: tuple[int, int], open_cells: bytearray, num_boxes: int, runs: int
) -> Walk | None:
    """Targets on random free cells that a box can be pulled from (two free cells in a row next to
    them); one pull takes each box off its target (boxes still on a target go in random order, as
    they become free to pull), then `runs` runs of pulls on random boxes and a last walk. None when
    the room has too few such cells, or the boxes left on targets cannot be pulled."""
    cols = shape[1]
    steps = (-cols, cols, -1, 1)
    floor = [cell for cell, is_open in enumerate(open_cells) if is_open]
    pullable = [
        cell for cell in floor if any(open_cells[cell + s] and open_cells[cell + 2 * s] for s in steps)
    ]
    if len(pullable) < num_boxes:
        return None
    targets = frozenset(rng.sample(pullable, num_boxes))
    boxes = set(targets)
    player = rng.choice([cell for cell in floor if cell not in boxes])
    states = [(player, frozenset(boxes))]
    run_ends: list[int] = []
    while len(run_ends) < num_boxes + runs:
        unsolved = len(run_ends) >= num_boxes
        came = _reach(open_cells, steps, player, boxes)
        options = [
            (box, step)
            for box in sorted(boxes if unsolved else boxes & targets)
            for step in steps
            if box + step in came
            and open_cells[box + 2 * step]
            and box + 2 * step not in boxes
            and box + step not in targets
        ]
        if not options:
            if unsolved:
                break
            return None
        box, step = rng.choice(options)
        states.extend((cell, frozenset(boxes)) for cell in _path(came, box + step))
        player = box + step
        run = rng.randint(1, max(shape) // 2) if unsolved else 1
        while run and open_cells[player + step] and player + step not in boxes and player not in targets:
            boxes.remove(box)
            box, player = player, player + step
            boxes.add(box)
            states.append((player, frozenset(boxes)))
            run -= 1
        run_ends.append(len(states) - 1)
    came = _reach(open_cells, steps, player, boxes)
    states.extend((cell, frozenset(boxes)) for cell in _path(came, rng.choice(sorted(came))))
    grid = tuple(
        tuple(
            TARGET if r * cols + c in targets else FLOOR if open_cells[r * cols + c] else WALL
            for c in range(cols)
        )
        for r in range(shape[0])
    )
    return Walk(grid, tuple(states), run_ends[num_boxes - 1])


def _reach(
    open_cells: bytearray, steps: tuple[int, ...], start: int, boxes: set[int]
) -> dict[int, int | None]:
    """Cells the player reaches from `start` without moving a box, each mapped to the cell before it."""
    came: dict[int, int | None] = {start: None}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        for step in steps:
            nxt = cell + step
            if open_cells[nxt] and nxt not in boxes and nxt not in came:
                came[nxt] = cell
                queue.append(nxt)
    return came


def _path(came: dict[int, int | None], goal: int) -> list[int]:
    """The cells after the start along the BFS path to `goal`, in walking order."""
    cells: list[int] = []
    cell: int | None = goal
    while cell is not None and came[cell] is not None:
        cells.append(cell)
        cell = came[cell]
    return cells[::-1]


def _connected(open_cells: bytearray, cols: int, floor: int) -> bool:
    """True when the `floor` open cells form one 4-connected region."""
    start = open_cells.index(True)
    return len(_reach(open_cells, (-cols, cols, -1, 1), start, set())) == floor
