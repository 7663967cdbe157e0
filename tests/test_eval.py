"""`vistarl eval --dummy`: the env's random player on held-out tasks (Sokoban levels, VSI questions); the
VSI seed's smoke test in an empty directory, as the random player needs no checkpoint."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.machine import outlasting
from vistarl.devtools.servers import vistarl_cmd
from vistarl.services.sokoban.actions import random_reply
from vistarl.trainer.eval import baseline_policy, summarize
from vistarl.trainer.rollout.engines.base import GenerateRequest
from vistarl.trainer.rollout.engines.sglang_api import SamplingParams
from vistarl.trainer.rollout.processor import VLProcessor
from vistarl.trainer.rollout.trajectory import Status, Trajectory

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "sokoban_tiny.yaml"
EVAL_S = 300.0
"""How long `vistarl eval --dummy` may take here."""


def dummy_eval(where: Path, *flags: str) -> str:
    """`vistarl eval --dummy FLAGS` run in the empty directory `where`; its stdout."""
    where.mkdir()
    done = subprocess.run(
        vistarl_cmd("eval", "--dummy", *flags), cwd=where, capture_output=True, text=True, timeout=EVAL_S
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@outlasting(EVAL_S)
def test_dummy_eval_plays_two_levels_and_saves_images_and_trajectories(
    tiny_qwen25: Path, tmp_path: Path
) -> None:
    out = tmp_path / "eval"
    flags = ("--config", str(CONFIG), "--checkpoint", str(tiny_qwen25), "--out", str(out))
    stdout = dummy_eval(tmp_path / "empty", *flags, "--max-episodes", "2")
    assert "success_rate" in stdout and "no checkpoint" not in stdout
    episodes = sorted(out.glob("episode-*"))
    assert [e.name for e in episodes] == ["episode-000", "episode-001"]
    for episode in episodes:
        trajectory = json.loads((episode / "trajectory.json").read_text())
        solved = trajectory["metrics"]["env/success"] == 1.0
        assert trajectory["status"] == ("COMPLETED" if solved else "TRUNCATED"), trajectory["error"]
        assert trajectory["images"] and all((episode / name).is_file() for name in trajectory["images"])
        replies = [m["content"] for m in trajectory["messages"] if m["role"] == "assistant"]
        assert replies and all(r.startswith("<answer>") and r.endswith("</answer>") for r in replies)
        assert 1 <= trajectory["metrics"]["turns"] <= 3
        assert "env/success" in trajectory["metrics"]


@pytest.mark.slow  # VSI renders its room tours: a minute of CPU
@outlasting(EVAL_S)
def test_the_vsi_seeds_smoke_test_prints_vsibench_scores_and_saves_each_question(tmp_path: Path) -> None:
    """The VSI seed's one-line smoke test, as it is written: no config, no checkpoint."""
    stdout = dummy_eval(tmp_path / "empty", "--env", "vsi", "--max-questions", "2")
    assert "benchmark/overall" in stdout
    assert "no checkpoint at runs/tiny-qwen2_5_vl" in " ".join(stdout.split())
    (out,) = (tmp_path / "empty" / "runs").glob("eval-vsi-*")
    episodes = sorted(out.glob("episode-*"))
    assert [episode.name for episode in episodes] == ["episode-000", "episode-001"]
    for episode in episodes:
        trajectory = json.loads((episode / "trajectory.json").read_text())
        assert f"benchmark/{trajectory['labels']['question_type']}" in stdout
        assert len(trajectory["images"]) >= 9, "the tour frames and the first view, at least"
        replies = [m["content"] for m in trajectory["messages"] if m["role"] == "assistant"]
        assert all(r.startswith(("<action>", "<answer>")) for r in replies)


def test_random_replies_are_reproducible_per_episode_and_turn(tiny_qwen25: Path) -> None:
    respond = baseline_policy(random_reply, VLProcessor.from_pretrained(tiny_qwen25))

    def request(seed: int, prompt_length: int) -> GenerateRequest:
        return GenerateRequest(engine_ids=[1] * prompt_length, sampling=SamplingParams(sampling_seed=seed))

    first = [respond(i, request(seed, 10 + turn)) for i, (seed, turn) in enumerate([(1, 0), (1, 1), (2, 0)])]
    again = [respond(0, request(seed, 10 + turn)) for seed, turn in [(1, 0), (1, 1), (2, 0)]]
    assert first == again
    assert len(set(respond(0, request(seed, 10)) for seed in range(20))) > 5


def test_summary_counts_failed_episodes_as_unsolved() -> None:
    outcomes = [
        (Status.COMPLETED, 5.0, {"env/success": 1.0, "turns": 2.0}),
        (Status.TRUNCATED, 1.0, {"env/success": 0.0, "turns": 4.0}),
        (Status.FAILED, 0.0, {}),
    ]
    trajectories = [
        Trajectory(
            episode_id=f"e{i}",
            group_id="g",
            policy_version=0,
            status=status,
            episode_reward=reward,
            metrics=m,
        )
        for i, (status, reward, m) in enumerate(outcomes)
    ]
    summary = summarize(trajectories)
    assert summary["eval/success_rate"] == 1 / 3
    assert summary["eval/reward_mean"] == 2.0
    assert summary["eval/turns_mean"] == 2.0
    assert summary["eval/failed"] == 1.0
