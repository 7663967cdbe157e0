"""Solvers and Boxoban levels: optimality (the A* agrees with the BFS), solvability, and every vendored
level parsing."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from vistarl.services.sokoban.boxoban import BOXOBAN_FILES, boxoban_levels, parse_boxoban
from vistarl.services.sokoban.game import DIRECTIONS, FLOOR, TARGET, WALL, Game, Level, LevelError
from vistarl.services.sokoban.solver import solve, solve_bfs, solve_optimal, solve_push_search

# The box goes up, then left: the player walks below it, pushes, then walks round to its right side.
DETOUR = "######\n# .  #\n#  $ #\n#@   #\n######"


def shortest_by_brute_force(level: Level, max_len: int) -> int | None:
    """The fewest moves that solve `level`, found by trying every move sequence up to `max_len`."""
    for length in range(max_len + 1):
        for moves in itertools.product(DIRECTIONS, repeat=length):
            if Game(level).play(moves):
                return length
    return None


def test_bfs_is_move_optimal_on_a_tiny_level() -> None:
    level = Level.from_xsb(DETOUR)
    result = solve_bfs(level)
    assert result.solved and result.moves is not None
    assert Game(level).play(result.moves)
    assert result.moves == ("right", "right", "up", "right", "up", "left")
    assert shortest_by_brute_force(level, 6) == 6


def test_bfs_handles_two_boxes_and_reports_unsolvable() -> None:
    two = Level.from_xsb("#######\n#@$ . #\n# $ . #\n#     #\n#######")
    result = solve_bfs(two)
    assert result.solved and result.moves is not None and Game(two).play(result.moves)
    stuck = Level.from_xsb("#####\n#$  #\n# @.#\n#####")
    assert solve_bfs(stuck).status == "unsolvable"
    assert solve_bfs(Level.from_xsb(DETOUR), max_moves=5).status == "limit"
    row_locked = Level.from_xsb("#######\n#@ $  #\n#    .#\n#######")
    assert solve_bfs(row_locked).status == "unsolvable"


def test_solve_dispatches_by_box_count() -> None:
    small = Level.from_xsb(DETOUR)
    assert solve(small).moves == solve_bfs(small).moves
    boxoban = boxoban_levels("unfiltered_test_000")[0]
    result = solve(boxoban, time_limit=10)
    assert result.moves is not None and Game(boxoban).play(result.moves)


@pytest.mark.parametrize("name", BOXOBAN_FILES)
def test_push_search_solves_boxoban_levels(name: str) -> None:
    for level in boxoban_levels(name)[:3]:
        result = solve_push_search(level, time_limit=10)
        assert result.solved and result.moves is not None
        assert Game(level).play(result.moves)


def test_push_search_gives_up_on_deadlocked_levels() -> None:
    corner = Level.from_xsb("######\n#$   #\n#  @.#\n######")
    assert solve_push_search(corner).status == "unsolvable"


@st.composite
def random_levels(draw: st.DrawFn) -> Level:
    """A small level with random walls and random distinct cells for targets, boxes and player (most
    are unsolvable, which the solvers must agree on too)."""
    rng = random.Random(draw(st.integers(min_value=0, max_value=2**31 - 1)))
    side, num_boxes = draw(st.integers(5, 7)), draw(st.integers(1, 2))
    grid = [
        [
            WALL if r in (0, side - 1) or c in (0, side - 1) or rng.random() < 0.15 else FLOOR
            for c in range(side)
        ]
        for r in range(side)
    ]
    free = [(r, c) for r in range(side) for c in range(side) if grid[r][c] == FLOOR]
    assume(len(free) > 2 * num_boxes)
    cells = rng.sample(free, 2 * num_boxes + 1)
    for r, c in cells[:num_boxes]:
        grid[r][c] = TARGET
    return Level(tuple(map(tuple, grid)), frozenset(cells[num_boxes:-1]), cells[-1])


@settings(max_examples=150, deadline=None)
@given(level=random_levels())
def test_optimal_search_agrees_with_the_bfs(level: Level) -> None:
    bfs, optimal = solve_bfs(level), solve_optimal(level)
    assert optimal.status == bfs.status
    if bfs.moves is not None:
        assert optimal.moves is not None and len(optimal.moves) == len(bfs.moves)
        assert Game(level).play(optimal.moves)


def test_optimal_search_reports_its_bounds() -> None:
    level = Level.from_xsb(DETOUR)
    assert solve_optimal(level, max_moves=5).status == "limit"
    moves = solve_optimal(level, max_moves=6).moves
    assert moves is not None and len(moves) == 6 and Game(level).play(moves)
    boxoban = boxoban_levels("hard_000")[0]
    assert solve_optimal(boxoban, max_states=50).status == "limit"


def test_all_boxoban_levels_parse() -> None:
    for name in BOXOBAN_FILES:
        levels = boxoban_levels(name)
        assert len(levels) == 1000
        for level in levels:
            assert level.shape == (10, 10)
            assert len(level.boxes) == 4 and len(level.targets) == 4


def test_boxoban_text_needs_headers() -> None:
    assert len(parse_boxoban("; 0\n#####\n#@$.#\n#####\n\n; 1\n#####\n#.$@#\n#####\n")) == 2
    with pytest.raises(LevelError, match="header"):
        parse_boxoban("#####\n#@$.#\n#####")
