"""Generated levels: every valid config gives a level for any seed, deterministically, within its bounds;
configs no seed could meet are refused at validation, and both sides of that line are checked."""

from __future__ import annotations

import itertools
import random
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from vistarl.services.sokoban import SokobanOptions, build_env, levels
from vistarl.services.sokoban.game import TARGET, Game
from vistarl.services.sokoban.generator import MAX_BOXES, GenerationError, generate_level, limits
from vistarl.services.sokoban.levels import generated_level
from vistarl.services.sokoban.reverse_play import reverse_walk, room
from vistarl.services.sokoban.solver import solve_bfs

SEEDS = st.integers(min_value=0, max_value=2**31 - 1)


@st.composite
def valid_configs(draw: st.DrawFn) -> dict[str, Any]:
    """Generator options inside the limits: any grid, box count, wall fraction and solution window."""
    shape = (draw(st.integers(5, 10)), draw(st.integers(5, 10)))
    num_boxes = draw(st.integers(1, limits(shape, 1).max_boxes))
    bounds = limits(shape, num_boxes)
    max_moves = draw(st.integers(bounds.shortest_max_moves, 100))
    min_moves = draw(st.integers(1, min(bounds.longest_min_moves, max_moves)))
    return {
        "grid_size": list(shape),
        "num_boxes": num_boxes,
        "wall_fraction": draw(st.floats(0.0, 0.5)),
        "min_solution_len": min_moves,
        "max_solution_len": max_moves,
    }


@settings(max_examples=40, deadline=None)
@given(config=valid_configs(), seed=SEEDS)
def test_every_valid_config_gives_a_level_for_any_seed(config: dict[str, Any], seed: int) -> None:
    options = SokobanOptions.model_validate(config)
    generated = generated_level(options, seed)
    level = generated.level
    assert level.shape == options.shape and len(level.boxes) == options.num_boxes == len(level.targets)
    assert all(level.grid[r][c] != TARGET for r, c in level.boxes)
    assert Game(level).play(generated.solution)
    assert options.min_solution_len <= len(generated.solution) <= options.max_moves
    levels._cached_level.cache_clear()
    fresh = generated_level(options, seed)
    assert fresh is not generated and fresh == generated
    env = build_env(seed=seed, **config)
    assert env.level == level and env.optimal_moves == len(generated.solution)


@settings(max_examples=40, deadline=None)
@given(
    seed=SEEDS,
    side=st.integers(5, 7),
    num_boxes=st.integers(1, 2),
    wall_fraction=st.floats(0.0, 0.5),
)
def test_small_levels_have_the_length_the_bfs_finds(
    seed: int, side: int, num_boxes: int, wall_fraction: float
) -> None:
    generated = generate_level(seed, (side, side), num_boxes, wall_fraction)
    result = solve_bfs(generated.level)
    assert result.moves is not None and len(result.moves) == len(generated.solution)


@settings(max_examples=25, deadline=None)
@given(seed=SEEDS, side=st.integers(5, 7), num_boxes=st.integers(1, 2))
def test_reverse_walk_states_are_solvable_and_grow_by_one_move_at_most(
    seed: int, side: int, num_boxes: int
) -> None:
    rng = random.Random(seed)
    walk = reverse_walk(rng, (side, side), room(rng, (side, side), 0.1, 9), num_boxes, runs=3)
    if walk is None:
        return
    lengths = []
    for index in range(len(walk.states)):
        level = walk.level(index)
        moves = solve_bfs(level).moves
        assert moves is not None
        lengths.append(len(moves))
        if index >= walk.first_unsolved:
            assert all(level.grid[r][c] != TARGET for r, c in level.boxes)
    assert lengths[0] == 0
    assert all(later <= earlier + 1 for earlier, later in itertools.pairwise(lengths))


def test_boxoban_sized_levels_work() -> None:
    levels = {build_env(seed=seed, grid_size=10, num_boxes=4).level for seed in range(4)}
    assert len(levels) == 4 and all(len(level.boxes) == 4 for level in levels)


# --- the line between what every seed gets and what no seed can count on ----------------------------


def edge_cases() -> list[tuple[dict[str, Any], dict[str, Any], str]]:
    """(config at an edge of the limits, the same config one step beyond, what the refusal says)."""
    three = limits((10, 10), 3)
    four = limits((10, 10), 4)
    return [
        ({"grid_size": 5, "num_boxes": 2}, {"grid_size": 5, "num_boxes": 3}, "num_boxes: a 5x5 grid"),
        ({"grid_size": [5, 6], "num_boxes": 3}, {"grid_size": [5, 6], "num_boxes": 4}, "larger grid_size"),
        ({"grid_size": 6, "num_boxes": MAX_BOXES}, {"grid_size": 6, "num_boxes": MAX_BOXES + 1}, "num_boxes"),
        (
            {"grid_size": 10, "num_boxes": 3, "min_solution_len": three.longest_min_moves},
            {"grid_size": 10, "num_boxes": 3, "min_solution_len": three.longest_min_moves + 1},
            "min_solution_len: ",
        ),
        (
            {"grid_size": 10, "num_boxes": 4, "max_solution_len": four.shortest_max_moves},
            {"grid_size": 10, "num_boxes": 4, "max_solution_len": four.shortest_max_moves - 1},
            "raise max_solution_len",
        ),
        (
            {"grid_size": 10, "num_boxes": 4, "max_steps": four.shortest_max_moves},
            {"grid_size": 10, "num_boxes": 4, "max_steps": four.shortest_max_moves - 1},
            "raise max_steps",
        ),
    ]


@pytest.mark.parametrize(("edge", "beyond", "says"), edge_cases())
def test_limits_are_met_at_the_edge_and_refused_beyond(
    edge: dict[str, Any], beyond: dict[str, Any], says: str
) -> None:
    for seed in range(3):
        env = build_env(seed=seed, **edge)
        assert env.optimal_moves is not None
        assert env.options.min_solution_len <= env.optimal_moves <= env.options.max_moves
    with pytest.raises(ValidationError) as caught:
        SokobanOptions.model_validate(beyond)
    assert says in str(caught.value)


def test_the_generator_gives_up_within_its_budget() -> None:
    with pytest.raises(GenerationError, match="within the search budget"):
        generate_level(0, (5, 5), 1, 0.0, min_moves=40, max_moves=60, max_states=20_000)


def test_a_seed_reset_by_a_whole_group_at_once_is_generated_once() -> None:
    """The samples of a GRPO group reset one seed at once, in the env pool's threads: one search for all."""
    options = SokobanOptions.model_validate({"grid_size": [6, 6], "max_solution_len": 3})
    seed = 2**40 + 51  # no other test's seed: the level is not cached yet
    before = levels._cached_level.cache_info().misses
    with ThreadPoolExecutor(max_workers=8) as pool:
        found = list(pool.map(lambda _: generated_level(options, seed), range(8)))
    assert levels._cached_level.cache_info().misses == before + 1
    assert all(level is found[0] for level in found)
