"""`scripts/demo_gpu_status.sh`: each run's last step, held-out points and final line, read from its files."""

from __future__ import annotations

import json
import subprocess
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_status_reports_each_runs_last_step_held_out_points_and_final_line(tmp_path: Path) -> None:
    (tmp_path / "3moves" / "rl").mkdir(parents=True)
    (tmp_path / "3moves.log").write_text(
        "held-out evaluation before SFT (runs/base)\n  success 2.0%, mean reward 0.020 over 200 episodes\n"
        "held-out evaluation after SFT \n(runs/a/long/path/sft)\n"  # rich wraps a long path
        "  success 6.5%, mean reward 0.065 over 200 episodes\n"
        "step 9  reward/mean=0.1\nstep 10  reward/mean=0.2\n"
        "held-out success: before 2.0% -> after SFT 6.5% -> after RL 9.0% (200 levels)\n"
    )
    records = [
        {"step": 10, "eval/success_rate": 0.12},
        {"step": 11, "reward/mean": 0.3, "train/entropy": 0.4123, "train/zero_variance_groups": 0.5625},
    ]
    (tmp_path / "3moves" / "rl" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp_path / "3moves" / "paired.txt").write_text(
        "== held-out levels of the curve (env.eval_seeds)\nruns/eval-sft: 13 of 200 solved; replies []\n"
        "solved by the first only: 4; by the second only: 43\nexact McNemar p = 0.000\n"
    )
    (tmp_path / "1move.log").write_text("held-out evaluation before SFT (runs/base)\n")
    sft = [{"step": k, "train/nll": 2.0 if k < 5 else 0.5, "sft/stage": 0.0} for k in range(1, 31)]
    sft += [{"step": 31, "train/nll": 0.25, "sft/stage": 1.0}]
    (tmp_path / "1move" / "sft").mkdir(parents=True)
    (tmp_path / "1move" / "sft" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in sft))
    (tmp_path / "driver.pid").write_text("999999999\n")
    script = REPO / "scripts" / "demo_gpu_status.sh"
    done = subprocess.run(["bash", str(script), str(tmp_path)], capture_output=True, text=True, check=True)
    lines = done.stdout.splitlines()
    assert lines[0] == "driver 999999999: finished"
    moves = lines[lines.index("== 3moves") + 1 :]
    assert moves[0] == "last step: step 10  reward/mean=0.2"
    assert moves[1] == "held-out: before SFT 2.0%, after SFT 6.5%, RL step 10 12.0%"
    assert moves[2] == "last RL step: entropy 0.412, zero_variance_groups 0.562"
    assert moves[3].startswith("held-out success: before 2.0%")
    assert moves[4:7] == [
        "== held-out levels of the curve (env.eval_seeds)",
        "solved by the first only: 4; by the second only: 43",
        "exact McNemar p = 0.000",
    ]
    one = lines[lines.index("== 1move") + 1 :]
    assert one[:4] == [
        "last step: none yet",
        "held-out: none yet",
        "SFT reading: 30 steps, nll 0.500 (last 20)",
        "SFT demonstrations: 1 steps, nll 0.250 (last 20)",
    ]


def test_archive_keeps_logs_metrics_and_evaluations_without_checkpoints(tmp_path: Path) -> None:
    out = tmp_path / "runs"
    kept = ["3moves.log", "3moves/rl/metrics.jsonl", "3moves/eval-rl/episode-000/trajectory.json"]
    dropped = ["3moves/rl/checkpoints/step-000010/actor/config.json", "3moves/rl/eval/step-000010/x.json"]
    dropped += ["3moves/demos.jsonl", "3moves/boards.jsonl"]  # the SFT data: tens of MB a run
    for name in kept + dropped + ["3moves/sft/model.safetensors"]:
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text("{}\n")
    archive = tmp_path / "runs.tgz"
    script = REPO / "scripts" / "demo_gpu_status.sh"
    done = subprocess.run(
        ["bash", str(script), str(out), "--archive", str(archive)], capture_output=True, text=True, check=True
    )
    assert done.stdout.splitlines()[-1].startswith(f"archived to {archive}")
    with tarfile.open(archive) as tar:
        names = {name.removeprefix("runs/") for name in tar.getnames()}
    assert set(kept) <= names
    assert not any("checkpoints" in n or "step-000010" in n or n.endswith(".safetensors") for n in names)
    assert not any(n.endswith(("demos.jsonl", "boards.jsonl")) for n in names)
