"""Sokoban solvers: an exact, move-optimal BFS for small levels and a best-effort push search for Boxoban.

- `solve_bfs` searches (player, boxes) states breadth-first over primitive moves, so a solution it finds
  has the fewest moves (the seed counts primitive moves). Practical up to 2 boxes, or 3 on tiny grids.
- `solve_optimal` runs A* over pushes, each costing the player's walk to it plus one move, bounded below
  by the cheapest matching of boxes to targets by push distance. Its solutions are move-optimal too,
  like the BFS's, and it reaches 4 boxes on 10x10 since it stores one state per push, not per move.
- `solve_push_search` runs weighted A* over pushes (player position normalised to its reachable area),
  prunes dead squares and freeze deadlocks, and stops at a time limit. Its solutions are valid, not optimal.

All work on a flat index of the grid padded with a ring of walls, so a neighbour is `cell + step`.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import operator
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, NamedTuple

from vistarl.services.sokoban.game import DIRECTIONS, TARGET, WALL, Level

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

    def __init__(self, grid: tuple[tuple[int, ...], ...]) -> None:
        self.width = len(grid[0]) + 2
        self.open = bytearray((len(grid) + 2) * self.width)
        for r, row in enumerate(grid):
            for c, code in enumerate(row):
                self.open[self.index((r, c))] = code != WALL
        self.targets = frozenset(
            self.index((r, c)) for r, row in enumerate(grid) for c, code in enumerate(row) if code == TARGET
        )
        self.steps = [(name, dr * self.width + dc) for name, (dr, dc) in DIRECTIONS.items()]
        self.push_dist = self._push_distances(self.targets)

    def index(self, pos: tuple[int, int]) -> int:
        return (pos[0] + 1) * self.width + pos[1] + 1

    def is_dead(self, cell: int) -> bool:
        """A square from which no push sequence can bring a box to any target."""
        return cell not in self.push_dist

    def _push_distances(self, targets: Iterable[int]) -> dict[int, int]:
        """Fewest pushes from each cell to its nearest of `targets`, ignoring other boxes (BFS of pulls)."""
        dist = dict.fromkeys(targets, 0)
        queue = deque(dist)
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
    board = _Board(level.grid)
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


class _Push(NamedTuple):
    """One node of the push search's tree: the push that led here, and the node before it (a named
    tuple, which the searches create several times faster than a frozen dataclass)."""

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
    board = _Board(level.grid)
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


class _Masks:
    """A board as bit masks over its flat index, for `solve_optimal`: a set of cells is one int."""

    def __init__(self, board: _Board) -> None:
        self.board = board
        self.width = board.width
        self.free = sum(1 << cell for cell, is_open in enumerate(board.open) if is_open)
        self.targets = sum(1 << cell for cell in board.targets)
        size = len(board.open)
        self.pushes = [
            [
                (cell - step, cell + step, step, name)
                for name, step in board.steps
                if board.open[cell - step] and board.open[cell + step] and not board.is_dead(cell + step)
            ]
            if board.open[cell]
            else []
            for cell in range(size)
        ]
        per_target = [board._push_distances({target}) for target in sorted(board.targets)]
        n = len(per_target)
        # A cost no matching of reachable pairs adds up to (each distance is below the cell count).
        self.unreachable = size * n
        self._cost = [tuple(dist.get(cell, self.unreachable) for dist in per_target) for cell in range(size)]
        # One getter per matching of boxes to targets, over the boxes' cost rows laid end to end; the
        # extra index points at a trailing 0, so that even one box gives a tuple to sum.
        self._matchings = [
            operator.itemgetter(*(row * n + col for row, col in enumerate(order)), n * n)
            for order in itertools.permutations(range(n))
        ]
        self._bounds: dict[int, int] = {}

    def bound(self, boxes: int) -> int:
        """Fewest pushes left, at least: the cheapest one-to-one matching of boxes to targets by push
        distance, other boxes ignored; `unreachable` or more when some box reaches no target left to
        it. Cached per box set."""
        bound = self._bounds.get(boxes)
        if bound is None:
            costs = [c for cell in _cells(boxes) for c in self._cost[cell]]
            costs.append(0)
            bound = min([sum(matching(costs)) for matching in self._matchings])
            self._bounds[boxes] = bound
        return bound

    def walks(self, player: int, free: int, goals: int) -> dict[int, int]:
        """Fewest moves from `player` over `free` cells to each cell of `goals` it reaches: a breadth-first
        flood, one shift per layer, stopped once every goal is found."""
        width = self.width
        found: dict[int, int] = {}
        frontier = seen = 1 << player
        depth = 0
        while frontier and goals:
            hits = frontier & goals
            if hits:
                goals &= ~hits
                for cell in _cells(hits):
                    found[cell] = depth
            depth += 1
            frontier = ((frontier << 1) | (frontier >> 1) | (frontier << width) | (frontier >> width)) & free
            frontier &= ~seen
            seen |= frontier
        return found


def solve_optimal(level: Level, max_moves: int | None = None, max_states: int = 200_000) -> SolveResult:
    """Move-optimal A* over pushes: a push costs the player's shortest walk to it plus the push, and
    `_Masks.bound` never overestimates, so the first solved state taken off the heap has the fewest
    moves. `limit` when no solution has at most `max_moves` moves, or after `max_states` states."""
    masks = _masks(level.grid)
    board = masks.board
    size = len(board.open)
    player0 = board.index(level.player)
    boxes0 = sum(1 << board.index(b) for b in level.boxes)
    if masks.bound(boxes0) >= masks.unreachable:
        return SolveResult("unsolvable", None, 1)
    tie = itertools.count()
    heap: list[tuple[int, int, int, int, int, _Push | None]] = [
        (masks.bound(boxes0), 0, 0, player0, boxes0, None)
    ]
    best = {boxes0 * size + player0: 0}
    while heap:
        bound, neg_moves, _, player, boxes, node = heapq.heappop(heap)
        if best[boxes * size + player] < -neg_moves:
            continue
        if max_moves is not None and bound > max_moves:
            return SolveResult("limit", None, len(best))
        if not boxes & ~masks.targets:
            return SolveResult("solved", _replay(board, level, node), len(best))
        if len(best) > max_states:
            return SolveResult("limit", None, len(best))
        free = masks.free & ~boxes
        options = []
        stands = 0
        for box in _cells(boxes):
            for push in masks.pushes[box]:
                if free >> push[0] & 1 and free >> push[1] & 1:
                    options.append((box, push))
                    stands |= 1 << push[0]
        walks = masks.walks(player, free, stands)
        for box, (stand, dest, step, name) in options:
            walk = walks.get(stand)
            if walk is None:
                continue
            moves = walk + 1 - neg_moves
            new_boxes = boxes ^ (1 << box) ^ (1 << dest)
            key = new_boxes * size + box
            if moves < best.get(key, moves + 1):
                best[key] = moves
                child = _Push(node, box, step, name)
                heapq.heappush(
                    heap, (moves + masks.bound(new_boxes), -moves, next(tie), box, new_boxes, child)
                )
    return SolveResult("unsolvable", None, len(best))


@functools.lru_cache(maxsize=16)
def _masks(grid: tuple[tuple[int, ...], ...]) -> _Masks:
    """The masks of a grid, kept for the next solves on it: a generator solves many states of one room,
    and the bounds cached per box set carry over."""
    return _Masks(_Board(grid))


def _cells(bits: int) -> list[int]:
    """The cell indices of a bit mask, lowest first."""
    cells = []
    while bits:
        low = bits & -bits
        cells.append(low.bit_length() - 1)
        bits ^= low
    return cells


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
