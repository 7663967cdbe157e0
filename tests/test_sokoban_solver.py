"""Solvers, generator and Boxoban levels: optimality, solvability, and every vendored level parsing."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.sokoban.boxoban import BOXOBAN_FILES, boxoban_levels, parse_boxoban
from services.sokoban.game import DIRECTIONS, Game, Level, LevelError
from services.sokoban.generator import GenerationError, generate_level
from services.sokoban.solver import solve, solve_bfs, solve_push_search

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


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(min_value=0, max_value=2**31 - 1),
    side=st.integers(min_value=5, max_value=7),
    num_boxes=st.integers(min_value=1, max_value=2),
)
def test_generated_levels_are_solvable_and_deterministic(seed: int, side: int, num_boxes: int) -> None:
    generated = generate_level(seed, (side, side), num_boxes, wall_fraction=0.1, max_moves=60)
    level = generated.level
    assert level.shape == (side, side) and len(level.boxes) == num_boxes == len(level.targets)
    assert not Game(level).solved
    assert Game(level).play(generated.solution)
    assert 1 <= len(generated.solution) <= 60
    assert generate_level(seed, (side, side), num_boxes, wall_fraction=0.1, max_moves=60) == generated


def test_generator_reports_unmeetable_bounds() -> None:
    with pytest.raises(GenerationError, match="relax the bounds"):
        generate_level(0, (4, 4), 1, min_moves=50, max_moves=60)


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
