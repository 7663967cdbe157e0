"""`vistarl demo learn` still learns: a small seeded CPU run of the demo's path (solver demonstrations, SFT,
GRPO from the SFT checkpoint, greedy held-out success before, after SFT and after RL), with thresholds.

The run is configs/sokoban_demo.yaml cut to about 80 CPU-seconds: 160 demonstrations, SFT in 80 steps
of 2 at lr 1e-3, two GRPO steps of 4 levels x 4 replies, 64 held-out levels. The model is
`vistarl model tiny --shape tiny --seed 0` (the `tiny_qwen25` fixture writes the same checkpoint).

The thresholds come from six seeds of this run, seed s meaning `--seed s` for the model and
`train.seed=s` (docs/results.md, "The CPU demo as a test", has the table and the command), with no
held-out level among the training levels: held-out success before SFT 0% in all six, after SFT
25-50%, after RL 2-25%, RL up to 17 levels below SFT (two GRPO steps of 16 episodes can swap the
policy's one direction for another, or undo the board reading SFT began).
- `SFT_MARGIN`: under half the smallest lift the seeds gave (25 points), so that every seed passes
  with 15 points to spare, while a run whose SFT teaches nothing (0%, the reply format unlearnt) fails.
- `RL_TOLERANCE`: 20 levels of 64, above the largest drop the seeds gave: it catches a GRPO stage
  that wrecks the policy outright (seed 0: from 41% to below 10%), not one that loses what SFT began.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from benchmarks import paired_eval
from tests.machine import outlasting
from vistarl.devtools.servers import vistarl_cmd

REPO = Path(__file__).resolve().parent.parent
DEMO_CONFIG = REPO / "configs" / "sokoban_demo.yaml"
DEMOS = 160
SETS = (
    "sft.batch_size=2",
    "sft.epochs=1",
    "sft.lr=1e-3",
    "env.eval_seeds=[100000,100064]",
    "train.steps=2",
    "rollout.rollout_batch_size=4",
    "train.seed=0",
)
SFT_MARGIN = 10.0
"""Points of held-out success that SFT must add to the figure before it."""
RL_TOLERANCE = 100 * 20 / 64
"""Points of held-out success that GRPO may lose from the SFT checkpoint it starts from."""
MALLOC = dict.fromkeys(("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_"), str(1 << 30))
"""glibc keeps freed memory instead of handing it back and faulting it in again at the next step:
without these, a third of this run's CPU time is spent in the kernel (docs/results.md)."""
DEMO_S = 900.0
"""How long `vistarl demo learn` may take here."""
HEADLINE = re.compile(r"before (\d+)% -> after SFT (\d+)% -> after RL (\d+)% \(64 levels\)$")


@outlasting(DEMO_S)
def test_sft_lifts_held_out_success_and_grpo_keeps_it(
    tiny_qwen25: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    command = vistarl_cmd("demo", "learn", "--config", str(DEMO_CONFIG), "--demos", str(DEMOS))
    for value in (f"model.path={tiny_qwen25}", *SETS):
        command += ["--set", value]
    command += ["--out", str(tmp_path / "demo")]
    done = subprocess.run(
        command, cwd=REPO, env={**os.environ, **MALLOC}, capture_output=True, text=True, timeout=DEMO_S
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = HEADLINE.search(done.stdout.strip().splitlines()[-1])
    assert found is not None, done.stdout[-2000:]
    _check_run_directory(tmp_path / "demo", capsys)
    before, after_sft, after_rl = map(float, found.groups())
    assert after_sft >= before + SFT_MARGIN, found.group(0)
    assert after_rl >= after_sft - RL_TOLERANCE, found.group(0)


def _check_run_directory(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """What the run leaves: each stage's 64 saved episodes, both GRPO steps' metrics, the RL curve; and
    `benchmarks.paired_eval` compares SFT with RL level by level."""
    for stage in ("eval-before", "eval-sft", "eval-rl"):
        assert len(list((root / stage).glob("episode-*/trajectory.json"))) == 64, stage
    assert len((root / "rl" / "metrics.jsonl").read_text().splitlines()) == 2
    assert (root / "rl" / "reward_curve.png").stat().st_size > 0
    paired_eval.main([str(root / "eval-sft"), str(root / "eval-rl")])
    printed = capsys.readouterr().out
    assert re.search(r"eval-sft: \d+ of 64 solved; replies", printed), printed
    assert re.search(r"exact McNemar p = [01]\.\d{3}$", printed.strip()), printed
