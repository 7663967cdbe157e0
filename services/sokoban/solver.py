"""Sokoban solvers: an exact, move-optimal BFS for small levels and a best-effort push search for Boxoban.

- `solve_bfs` searches (player, boxes) states breadth-first over primitive moves, so a solution it finds
  has the fewest moves (the seed counts primitive moves). Practical up to 2 boxes, or 3 on tiny grids.
- `solve_push_search` runs weighted A* over pushes (player position normalised to its reachable area),
  prunes dead squares and freeze deadlocks, and stops at a time limit. Its solutions are valid, not optimal.

Both work on a flat index of the grid padded with a ring of walls, so a neighbour is `cell + step`.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections import deque
from dataclasses import dataclass
from typing import Literal

from services.sokoban.game import DIRECTIONS, WALL, Level

SolveStatus = Literal["solved", "unsolvable", "limit"]

EXACT_MAX_BOXES = 2


@dataclass(frozen=True)
class SolveResult:
    """A search outcome: the primitive moves when solved, else why not (exhausted or out of budget)."""

    status: SolveStatus
    moves: tuple[str, ...] | None
    states: int

    @property
    def solved(self) -> bool:
        return self.status == "solved"


class _Board:
    """The static part of a level on a padded flat index: open cells, targets, and dead squares."""

    def __init__(self, level: Level) -> None:
        rows, cols = level.shape
        self.width = cols + 2
        self.open = bytearray((rows + 2) * self.width)
        for r, row in enumerate(level.grid):
            for c, code in enumerate(row):
                self.open[self.index((r, c))] = code != WALL
        self.targets = frozenset(self.index(t) for t in level.targets)
        self.steps = [(name, dr * self.width + dc) for name, (dr, dc) in DIRECTIONS.items()]
        self.push_dist = self._push_distances()

    def index(self, pos: tuple[int, int]) -> int:
        return (pos[0] + 1) * self.width + pos[1] + 1

    def is_dead(self, cell: int) -> bool:
        """A square from which no push sequence can bring a box to any target."""
        return cell not in self.push_dist

    def _push_distances(self) -> dict[int, int]:
        """Fewest pushes from each cell to its nearest target, ignoring other boxes (BFS of pulls)."""
        dist = dict.fromkeys(self.targets, 0)
        queue = deque(self.targets)
        while queue:
            cell = queue.popleft()
            for _, step in self.steps:
                prev, player = cell - step, cell - 2 * step
                if self.open[prev] and self.open[player] and prev not in dist:
                    dist[prev] = dist[cell] + 1
                    queue.append(prev)
        return dist

    def reachable(self, player: int, boxes: frozenset[int]) -> dict[int, tuple[int, str] | None]:
        """The cells the player reaches without pushing, each mapped to (previous cell, move) for paths."""
        came: dict[int, tuple[int, str] | None] = {player: None}
        queue = deque([player])
        while queue:
            cell = queue.popleft()
            for name, step in self.steps:
                nxt = cell + step
                if self.open[nxt] and nxt not in boxes and nxt not in came:
                    came[nxt] = (cell, name)
                    queue.append(nxt)
        return came

    def is_frozen(self, cell: int, boxes: frozenset[int], as_walls: frozenset[int] = frozenset()) -> bool:
        """True when the box at `cell` can move along neither axis, ever (walls, dead pairs, frozen boxes)."""
        return all(self._axis_blocked(cell, axis, boxes, as_walls) for axis in (1, self.width))

    def _axis_blocked(self, cell: int, axis: int, boxes: frozenset[int], as_walls: frozenset[int]) -> bool:
        ends = (cell - axis, cell + axis)
        if any(not self.open[e] or e in as_walls for e in ends):
            return True
        if all(self.is_dead(e) for e in ends):
            return True
        treat = as_walls | {cell}
        return any(e in boxes and self.is_frozen(e, boxes, treat) for e in ends)

    def freeze_deadlock(self, boxes: frozenset[int], moved: int) -> bool:
        """True if the push to `moved` froze it, or a neighbour, off a target."""
        candidates = [moved] + [moved + step for _, step in self.steps if moved + step in boxes]
        return any(c not in self.targets and self.is_frozen(c, boxes) for c in candidates)


def solve(level: Level, time_limit: float = 10.0) -> SolveResult:
    """Solve with the exact BFS for up to `EXACT_MAX_BOXES` boxes, else with the bounded push search."""
    if len(level.boxes) <= EXACT_MAX_BOXES:
        return solve_bfs(level, time_limit=time_limit)
    return solve_push_search(level, time_limit=time_limit)


def solve_bfs(
    level: Level,
    max_moves: int | None = None,
    max_states: int = 2_000_000,
    time_limit: float | None = None,
) -> SolveResult:
    """Move-optimal BFS over (player, boxes); `limit` when a bound (moves, states, time) stops it first."""
    board = _Board(level)
    start = (board.index(level.player), frozenset(board.index(b) for b in level.boxes))
    if start[1] <= board.targets:
        return SolveResult("solved", (), 1)
    deadline = None if time_limit is None else time.monotonic() + time_limit
    parents: dict[tuple[int, frozenset[int]], tuple[tuple[int, frozenset[int]], str] | None] = {start: None}
    frontier = [start]
    depth = 0
    while frontier:
        if (max_moves is not None and depth >= max_moves) or (deadline and time.monotonic() > deadline):
            return SolveResult("limit", None, len(parents))
        depth += 1
        next_frontier = []
        for state in frontier:
            player, boxes = state
            for name, step in board.steps:
                cell = player + step
                if not board.open[cell]:
                    continue
                new_boxes = boxes
                if cell in boxes:
                    dest = cell + step
                    if not board.open[dest] or dest in boxes or board.is_dead(dest):
                        continue
                    new_boxes = (boxes - {cell}) | {dest}
                child = (cell, new_boxes)
                if child in parents:
                    continue
                parents[child] = (state, name)
                if new_boxes is not boxes and new_boxes <= board.targets:
                    return SolveResult("solved", _unwind(parents, child), len(parents))
                next_frontier.append(child)
            if len(parents) > max_states:
                return SolveResult("limit", None, len(parents))
        frontier = next_frontier
    return SolveResult("unsolvable", None, len(parents))


def _unwind(parents: dict, state: tuple[int, frozenset[int]]) -> tuple[str, ...]:
    """Follow parent links back to the start and return the moves in order."""
    moves: list[str] = []
    link = parents[state]
    while link is not None:
        state, name = link
        moves.append(name)
        link = parents[state]
    return tuple(reversed(moves))


@dataclass(frozen=True)
class _Push:
    """One node of the push search's tree: the push that led here, and the node before it."""

    parent: _Push | None
    box: int
    step: int
    name: str


def solve_push_search(
    level: Level,
    time_limit: float = 10.0,
    weight: float = 3.0,
    max_states: int = 1_000_000,
) -> SolveResult:
    """Weighted A* over pushes, f = pushes + weight * (sum of push distances to nearest targets)."""
    board = _Board(level)
    boxes0 = frozenset(board.index(b) for b in level.boxes)
    if any(board.is_dead(b) for b in boxes0 - board.targets):
        return SolveResult("unsolvable", None, 0)
    deadline = time.monotonic() + time_limit
    tie = itertools.count()
    heap: list[tuple[float, int, int, int, frozenset[int], _Push | None]] = []
    heapq.heappush(heap, (0.0, 0, next(tie), board.index(level.player), boxes0, None))
    closed: set[tuple[int, frozenset[int]]] = set()
    popped = 0
    while heap:
        popped += 1
        if len(closed) > max_states or (popped % 256 == 0 and time.monotonic() > deadline):
            return SolveResult("limit", None, len(closed))
        _, pushes, _, player, boxes, node = heapq.heappop(heap)
        reach = board.reachable(player, boxes)
        key = (min(reach), boxes)
        if key in closed:
            continue
        closed.add(key)
        if boxes <= board.targets:
            return SolveResult("solved", _replay(board, level, node), len(closed))
        for box in boxes:
            for name, step in board.steps:
                dest = box + step
                if box - step not in reach or not board.open[dest] or dest in boxes or board.is_dead(dest):
                    continue
                new_boxes = (boxes - {box}) | {dest}
                if board.freeze_deadlock(new_boxes, dest):
                    continue
                h = sum(board.push_dist[b] for b in new_boxes)
                child = _Push(node, box, step, name)
                heapq.heappush(heap, (pushes + 1 + weight * h, pushes + 1, next(tie), box, new_boxes, child))
    return SolveResult("unsolvable", None, len(closed))


def _replay(board: _Board, level: Level, node: _Push | None) -> tuple[str, ...]:
    """Expand a chain of pushes into primitive moves: walk to each push position, then push."""
    pushes: list[_Push] = []
    while node is not None:
        pushes.append(node)
        node = node.parent
    player = board.index(level.player)
    boxes = frozenset(board.index(b) for b in level.boxes)
    moves: list[str] = []
    for push in reversed(pushes):
        came = board.reachable(player, boxes)
        walk: list[str] = []
        cell = push.box - push.step
        while (link := came[cell]) is not None:
            cell, name = link
            walk.append(name)
        moves.extend(reversed(walk))
        moves.append(push.name)
        boxes = (boxes - {push.box}) | {push.box + push.step}
        player = push.box
    return tuple(moves)
