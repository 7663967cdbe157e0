"""The Sokoban env's Python API: options and level sources, observations, rendering, episode reward."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from vistarl.services.env_api import load_env_factory
from vistarl.services.sokoban import ENV_FACTORY, SokobanOptions, build_env
from vistarl.services.sokoban.boxoban import boxoban_levels
from vistarl.services.sokoban.prompt import IMAGE_HINT
from vistarl.services.sokoban.render import (
    BOX_COLOR,
    BOX_OUTLINE_COLOR,
    DIAMOND_COLOR,
    FLOOR_COLOR,
    GRID_LINE_COLOR,
    PLAYER_COLOR,
    TARGET_COLOR,
    WALL_COLOR,
)
from vistarl.services.sokoban.reward import box_target_distance, episode_reward, reward

CORRIDOR = "#######\n#@ $ .#\n#######"


# --- level sources and option validation --------------------------------------------------------


def test_generated_levels_are_deterministic_per_seed() -> None:
    assert build_env(seed=11).level == build_env(seed=11).level
    assert len({build_env(seed=s).render_text() for s in range(8)}) > 1


def test_defaults_match_the_seed() -> None:
    env = build_env(seed=0)
    obs, info = env.reset()
    assert env.level.shape == (6, 6) and len(env.level.boxes) == 1
    assert obs["images"][0].size == (384, 384)
    assert IMAGE_HINT in obs["text"] and info["max_steps"] == 100
    assert info["seed"] == 0 and info["optimal_moves"] >= 1


def test_solution_length_bounds_set_difficulty() -> None:
    env = build_env(seed=3, min_solution_len=9, max_solution_len=10)
    assert env.optimal_moves is not None and 9 <= env.optimal_moves <= 10


def test_initial_fields_round_trip() -> None:
    source = build_env(seed=5)
    env = build_env(**source.level.to_codes())
    assert env.level == source.level
    assert env.seed is None and env.render_text() == source.render_text()


def test_boxoban_source_accepts_names_with_or_without_txt() -> None:
    level = build_env(boxoban={"file": "hard_000.txt", "index": 7}).level
    assert level == boxoban_levels("hard_000")[7]
    assert build_env(boxoban={"file": "hard_000", "index": 7}).level == level


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"xsb": CORRIDOR, "boxoban": {"file": "hard_000", "index": 0}}, "xsb and boxoban"),
        ({"initial_base_grid": [[0]], "initial_boxes": []}, "initial_player"),
        ({"xsb": CORRIDOR, "seed": 3}, "seed"),
        ({"xsb": CORRIDOR, "grid_size": 6}, "grid_size"),
        ({"xsb": CORRIDOR, "num_boxes": 2}, "num_boxes"),
        ({"xsb": "#####\n#@x #\n#####"}, "xsb"),
        ({"initial_base_grid": [[0, 7]], "initial_boxes": [], "initial_player": [0, 0]}, "initial_base_grid"),
        ({"boxoban": {"file": "hard_001", "index": 0}}, "boxoban.file"),
        ({"boxoban": {"file": "hard_000", "index": 1000}}, "boxoban"),
        ({"max_solution_len": 150}, "max_solution_len"),
        ({"min_solution_len": 20, "max_solution_len": 10}, "min_solution_len"),
        ({"grid_size": 4}, "grid_size"),
        ({"grid_size": [6, 11]}, "grid_size"),
        ({"num_boxes": 5}, "num_boxes"),
        ({"grid_size": 5, "num_boxes": 3}, "num_boxes"),
        ({"min_solution_len": 11}, "min_solution_len"),
        ({"num_boxes": 3, "max_steps": 10}, "max_steps"),
        ({"render_mode": "ascii"}, "render_mode"),
        ({"cell_size": 4}, "cell_size"),
        ({"max_step": 10}, "max_step"),
    ],
)
def test_invalid_options_name_the_field(config: dict, field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        SokobanOptions.model_validate(config)
    assert field in str(caught.value)


def test_factory_is_registered_and_uses_the_reset_seed() -> None:
    assert load_env_factory("sokoban") is ENV_FACTORY
    options = ENV_FACTORY.options_model.model_validate({"render_mode": "text"})
    env = ENV_FACTORY.create(options, 42, None)
    assert env.reset()[1]["seed"] == 42
    assert "render_mode" in ENV_FACTORY.config_schema()["properties"]
    assert "<answer>" in ENV_FACTORY.system_prompt


# --- samples, observations, messages -------------------------------------------------------------


def test_build_env_from_sample_with_overrides() -> None:
    row = {"extra_info": {"env_config": {"xsb": CORRIDOR, "render_mode": "vision"}}}
    env = build_env(sample=row, render_mode="text")
    obs, _ = env.reset()
    assert env.options.render_mode == "text" and obs["images"] == []
    assert CORRIDOR in obs["text"]
    with pytest.raises(ValueError, match="env_config"):
        build_env(sample={"prompt": "no config"})


@pytest.mark.parametrize(
    ("mode", "n_images", "has_grid"), [("vision", 1, False), ("text", 0, True), ("both", 1, True)]
)
def test_render_modes(mode: str, n_images: int, has_grid: bool) -> None:
    env = build_env(xsb=CORRIDOR, render_mode=mode)
    obs, _ = env.reset()
    assert len(obs["images"]) == n_images
    assert (CORRIDOR in obs["text"]) == has_grid and (IMAGE_HINT in obs["text"]) != has_grid
    assert obs["text"].startswith("[Observation]\n")
    assert obs["text"].endswith(
        "Valid last actions: None\nProvide your next move(s) using Up, Down, Left, Right."
    )
    obs = env.step("<answer>Right, Up</answer>").observation
    assert "Valid last actions: right, up\n" in obs["text"]


def test_format_observation_is_an_openai_user_message() -> None:
    env = build_env(xsb=CORRIDOR, render_mode="both")
    obs, _ = env.reset()
    message = env.format_observation(obs)
    assert message["role"] == "user"
    image_part, text_part = message["content"]
    assert image_part["type"] == "image_url" and image_part["image_url"]["url"] is obs["images"][0]
    assert text_part == {"type": "text", "text": obs["text"]}


# --- rendering -----------------------------------------------------------------------------------


def test_render_size_follows_cell_size() -> None:
    env = build_env(boxoban={"file": "medium_valid_000", "index": 0}, cell_size=16)
    assert env.render_image().size == (160, 160)


def test_render_colours_at_known_pixels() -> None:
    # Row 1: wall, player, box, floor, target, wall; row 2: box on target at col 1 (one more target and box).
    env = build_env(xsb="######\n#@$ .#\n#*   #\n######", cell_size=64)
    image = env.render_image()
    assert image.size == (384, 256)
    rgb = image.convert("RGB")

    def cell(row: int, col: int, y: int, x: int) -> tuple[int, int, int]:
        return rgb.getpixel((col * 64 + x, row * 64 + y))

    assert cell(0, 0, 32, 32) == WALL_COLOR
    assert cell(1, 3, 32, 32) == FLOOR_COLOR
    assert cell(1, 3, 0, 32) == GRID_LINE_COLOR and cell(1, 3, 32, 0) == GRID_LINE_COLOR
    assert cell(1, 4, 32, 32) == DIAMOND_COLOR and cell(1, 4, 16, 32) == TARGET_COLOR
    assert cell(1, 2, 12, 32) == BOX_COLOR and cell(1, 2, 32, 5) == BOX_OUTLINE_COLOR
    assert cell(2, 1, 12, 32) == BOX_COLOR and cell(2, 1, 32, 5) == TARGET_COLOR
    assert cell(1, 1, 40, 32) == PLAYER_COLOR


def test_render_follows_the_state() -> None:
    env = build_env(xsb=CORRIDOR, cell_size=8)
    env.reset()
    before = env.render_image().tobytes()
    env.step("right")
    assert env.render_image().tobytes() != before


# --- rewards -------------------------------------------------------------------------------------


def test_box_target_distance_is_greedy_in_sorted_box_order() -> None:
    # Greedy gives (1,1)->(1,2) then (1,4)->(3,1): 1 + 5 = 6, although the best matching costs 4.
    assert box_target_distance([(1, 4), (1, 1)], [(3, 1), (1, 2)]) == 6
    assert box_target_distance([(2, 2)], [(2, 2)]) == 0
    assert box_target_distance([(0, 0), (0, 3)], [(0, 1)]) == 3


def test_episode_reward_formula() -> None:
    assert episode_reward([0.5, -0.1, 0.2], True, 4, 0) == pytest.approx(0.2 + 5 + 4)
    assert episode_reward([], False, 3, 3) == 0.0
    assert episode_reward([-0.05], False, 2, 3) == pytest.approx(-0.05 - 1)


def test_env_reports_the_episode_reward_at_done() -> None:
    env = build_env(xsb=CORRIDOR)
    _, info = env.reset()
    assert info["dist0"] == 2
    first = env.step("left right")
    last = env.step("right right")
    assert last.terminated
    expected = (-0.04 + 1.02) / 2 + 5 + 2
    assert last.info["episode_reward"] == pytest.approx(expected)
    assert reward([first.reward, last.reward], last.info) == pytest.approx(expected)
    metrics = last.info["metrics"]
    assert metrics == {
        "success": True,
        "steps": 4,
        "turns": 2,
        "valid_actions": 4,
        "effective_actions": 3,
        "dist0": 2,
        "dist1": 0,
    }


def test_reward_hook_works_for_a_truncated_episode() -> None:
    env = build_env(xsb=CORRIDOR)
    env.reset()
    result = env.step("right right")
    assert not result.done and "episode_reward" not in result.info
    assert reward([result.reward], result.info) == pytest.approx(0.02 + 0 + (2 - 1))
