"""`benchmarks/blind_replies.py`: the board-blind baseline of the Sokoban held-out sets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import blind_replies
from vistarl.services.sokoban.options import SokobanOptions

OPTIONS = SokobanOptions(grid_size=6, num_boxes=1, max_solution_len=3, render_mode="text")


def test_every_reply_of_up_to_three_moves_is_played() -> None:
    replies = blind_replies.blind_replies(OPTIONS)
    assert len(replies) == len(set(replies)) == 4 + 4**2 + 4**3
    assert "Up" in replies and "Left, Up, Right" in replies


def test_a_level_is_solved_by_no_reply_shorter_than_its_optimal_one() -> None:
    """Per level: some reply of its optimal length solves it, none shorter does."""
    for seed in range(100000, 100006):
        solved, lengths = blind_replies.solved_by_reply(OPTIONS, range(seed, seed + 1))
        (optimal,) = lengths
        winners = [reply for reply, count in solved.items() if count]
        assert min(len(reply.split(", ")) for reply in winners) == optimal, (seed, winners)


def write_eval(directory: Path, replies: list[tuple[str, bool]]) -> Path:
    """An evaluation directory as `vistarl eval` writes it, one episode per (reply, solved)."""
    for i, (reply, won) in enumerate(replies):
        episode = directory / f"episode-{i:03d}"
        episode.mkdir(parents=True)
        trajectory = {
            "group_id": f"eval-g{i}",
            "messages": [{"role": "user", "content": "board"}, {"role": "assistant", "content": reply}],
            "metrics": {"env/success": float(won)},
        }
        (episode / "trajectory.json").write_text(json.dumps(trajectory))
    return directory


def test_the_report_counts_a_policys_distinct_replies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    answers = [("<answer>Up</answer>", True), ("<answer>Up</answer>", False), ("<answer>Left</answer>", True)]
    run = write_eval(tmp_path / "eval-rl", answers)
    blind_replies.main(["--seeds", "100000", "100004", "--top", "2", str(run)])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("4 levels, seeds 100000-100003; optimal lengths {")
    assert lines[1].startswith("best blind replies: ") and lines[1].count("%") == 2
    assert lines[2] == f"{run}: 66.7% solved with 2 distinct replies to 3 boards"


def test_a_missing_config_or_an_empty_seed_range_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="cannot read config file"):
        blind_replies.main(["--config", str(tmp_path / "nope.yaml")])
    with pytest.raises(SystemExit, match="END must be above FIRST"):
        blind_replies.main(["--seeds", "100000", "100000"])
