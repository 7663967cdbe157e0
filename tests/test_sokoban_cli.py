"""`vistarl sokoban solve` and `vistarl demo solver`, run as a user would."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from PIL import Image
from typer.testing import CliRunner

from vistarl.cli.main import app
from vistarl.devtools.servers import vistarl_cmd
from vistarl.httpserver.launch import free_port


def test_solve_reports_the_solve_rate() -> None:
    result = CliRunner().invoke(
        app,
        ["sokoban", "solve", "--file", "medium_valid_000.txt", "--limit", "3", "--per-level", "10"],
        env={"COLUMNS": "160"},
    )
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if "medium_valid_000" in line)
    cells = [cell.strip() for cell in row.strip("│┃ ").split("│")]
    assert cells[:5] == ["medium_valid_000", "3", "3", "3", "100.0%"]


def test_solve_rejects_an_unknown_file() -> None:
    result = CliRunner().invoke(app, ["sokoban", "solve", "--file", "easy_000"])
    assert result.exit_code != 0
    assert "unknown Boxoban file" in result.output


def test_demo_solver_plays_over_http_and_saves_the_run(tmp_path: Path) -> None:
    out = tmp_path / "run"
    command = vistarl_cmd("demo", "solver", "--levels", "2", "--out", str(out), "--port", str(free_port()))
    env = {**os.environ, "COLUMNS": "160"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Application shutdown complete" in (out / "server.log").read_text()
    for episode in ("episode-00", "episode-01"):
        trajectory = json.loads((out / episode / "trajectory.json").read_text())
        assert trajectory["result"]["success"] is True
        turns = trajectory["turns"]
        assert (
            turns[-1]["done"]
            and turns[-1]["info"]["episode_reward"] == trajectory["result"]["episode_reward"]
        )
        assert len(turns) == 1 + -(-len(trajectory["solution"]) // 3)
        for turn in turns:
            (name,) = turn["images"]
            assert Image.open(out / episode / name).size == (384, 384)
