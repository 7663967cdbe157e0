"""Sokoban rules on hand-made levels: each per-move reward case, turn limits, episode end, action parsing."""

from __future__ import annotations

import pytest

from vistarl.services.env_api import StepResult
from vistarl.services.sokoban import build_env
from vistarl.services.sokoban.actions import parse_actions
from vistarl.services.sokoban.game import Game, Level, LevelError

# Player, floor, box, floor, target in a corridor: Right x3 solves it.
CORRIDOR = "#######\n#@ $ .#\n#######"


def play(xsb: str, *turns: str, **config: object) -> list[StepResult]:
    """Reset an env on `xsb` and play each turn; the step results."""
    env = build_env(xsb=xsb, render_mode="text", **config)
    env.reset()
    return [env.step(turn) for turn in turns]


def test_wall_hit_costs_and_changes_nothing() -> None:
    env = build_env(xsb=CORRIDOR, render_mode="text")
    env.reset()
    before = env.render_text()
    result = env.step("<answer>Left</answer>")
    info = result.info
    assert result.reward == pytest.approx(-0.05)
    assert env.render_text() == before
    assert not result.done and not info["action_is_effective"]
    assert info["metrics"]["steps"] == 1 and info["metrics"]["effective_actions"] == 0


def test_effective_move_earns_step_bonus() -> None:
    env = build_env(xsb=CORRIDOR, render_mode="text")
    env.reset()
    result = env.step("Right")
    assert result.reward == pytest.approx(0.01)
    assert env.render_text() == "#######\n# @$ .#\n#######"
    assert result.info["action_is_effective"]


def test_blocked_push_by_wall() -> None:
    env = build_env(xsb="######\n#. @$#\n######", render_mode="text")
    env.reset()
    assert env.step("right").reward == pytest.approx(-0.05)
    assert env.render_text() == "######\n#. @$#\n######"


def test_blocked_push_by_box() -> None:
    level = "#######\n#@$$..#\n#######"
    env = build_env(xsb=level, render_mode="text")
    env.reset()
    assert env.step("right").reward == pytest.approx(-0.05)
    assert env.render_text() == level


def test_push_onto_target_solves_and_ends_episode() -> None:
    first, last = play(CORRIDOR, "right right", "right")
    assert first.reward == pytest.approx(0.02)
    assert last.reward == pytest.approx(0.01 + 1.0)
    assert last.terminated and not last.truncated and last.info["success"] and last.info["metrics"]["success"]
    assert "episode_reward" in last.info and "episode_reward" not in first.info


def test_push_off_target_is_penalised() -> None:
    # A box on a target at (1,2), a free target at (1,4), a second box at (1,5).
    off, on = play("#######\n#@* .$#\n#######", "right", "right")
    assert off.reward == pytest.approx(0.01 - 0.5)
    assert on.reward == pytest.approx(0.01 + 1.0)
    assert not on.info["success"]


def test_push_from_target_to_target_earns_both_terms() -> None:
    (result,) = play("########\n#@*.  $#\n########", "right")
    assert result.reward == pytest.approx(0.01 + 1.0 - 0.5)


def test_turn_reward_is_sum_of_its_moves() -> None:
    (result,) = play(CORRIDOR, "left, right; right")
    assert result.reward == pytest.approx(-0.05 + 0.01 + 0.01)
    assert result.info["actions"] == ["left", "right", "right"]


def test_at_most_three_actions_per_turn() -> None:
    info = play("#########\n#@     $#\n#.      #\n#########", "right right right right right")[0].info
    assert info["actions"] == ["right"] * 3
    assert info["metrics"]["steps"] == 3


def test_actions_per_turn_is_configurable() -> None:
    (result,) = play(CORRIDOR, "right right right right", max_actions_per_turn=1)
    assert result.info["actions"] == ["right"]


def test_step_cap_stops_moves_and_truncates_the_episode() -> None:
    first, second = play(CORRIDOR, "left left", "left left left", max_steps=3)
    assert not first.done and first.info["metrics"]["steps"] == 2
    assert second.truncated and not second.terminated and second.info["actions"] == ["left"]
    assert second.info["metrics"]["steps"] == 3 and not second.info["success"]
    assert second.reward == pytest.approx(-0.05)


def test_turn_without_valid_action_scores_zero_and_continues() -> None:
    (result,) = play(CORRIDOR, "<answer>jump over the box</answer>")
    info = result.info
    assert result.reward == 0.0 and not result.done
    assert not info["action_is_valid"] and info["actions"] == []
    assert info["metrics"]["turns"] == 1 and info["metrics"]["steps"] == 0


def test_solved_episode_refuses_more_steps() -> None:
    env = build_env(xsb=CORRIDOR)
    env.reset()
    env.step("right right")
    assert env.step("right").done
    with pytest.raises(RuntimeError, match="over"):
        env.step("left")
    env.reset()
    result = env.step("left")
    assert not result.done and result.info["metrics"]["turns"] == 1


def test_step_before_reset_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="reset"):
        build_env(xsb=CORRIDOR).step("right")


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("<think>up up</think><ANSWER>Right, down</answer>", ["right", "down"]),
        ("<answer>left</answer> then <answer>up</answer>", ["left"]),
        ("up;left\nDOWN right", ["up", "left", "down"]),
        ("<answer>Up, jump, Left.</answer>", ["up"]),
        ("<answer>up, down", ["down"]),
        ("<answer>\n  Down\tRIGHT \n</answer>", ["down", "right"]),
        ("no moves here", []),
    ],
)
def test_parse_actions(response: str, expected: list[str]) -> None:
    assert parse_actions(response) == expected


def test_xsb_round_trip_and_players_on_targets() -> None:
    text = "######\n#+$$ #\n#* . #\n######"
    level = Level.from_xsb(text)
    assert level.player == (1, 1) and level.boxes == {(1, 2), (1, 3), (2, 1)}
    assert level.targets == {(1, 1), (2, 1), (2, 3)}
    assert level.to_xsb() == text
    codes = level.to_codes()
    assert (
        Level.from_codes(codes["initial_base_grid"], codes["initial_boxes"], codes["initial_player"]) == level
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("####\n#@x#\n####", "unknown character"),
        ("####\n#$.#\n####", "exactly one player"),
        ("#####\n#@$ #\n#####", "as many boxes as targets"),
        ("", "empty"),
    ],
)
def test_bad_xsb_is_rejected(text: str, message: str) -> None:
    with pytest.raises(LevelError, match=message):
        Level.from_xsb(text)


def test_game_replays_moves() -> None:
    assert Game(Level.from_xsb(CORRIDOR)).play(["right"] * 3)
    assert not Game(Level.from_xsb(CORRIDOR)).play(["right"] * 2)
