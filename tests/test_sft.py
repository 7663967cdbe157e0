"""Supervised warm start: solver demonstrations and `vistarl sft` on them (`vistarl demo learn` end to end
is tests/test_demo_learns.py)."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from benchmarks import paired_eval, perception_probe
from vistarl.cli.main import app
from vistarl.cli.sokoban import write_transcriptions
from vistarl.clients.images import decode_image
from vistarl.devtools.servers import vistarl_cmd
from vistarl.services.sokoban.demos import TRANSCRIBE_FIRST_SEED, TRANSCRIBE_INSTRUCTION, demonstration
from vistarl.services.sokoban.env import SokobanEnv
from vistarl.services.sokoban.game import Level
from vistarl.services.sokoban.options import SokobanOptions
from vistarl.services.sokoban.render import render_image
from vistarl.trainer.config import load_config
from vistarl.trainer.learner.models import load_lm
from vistarl.trainer.rollout.processor import VLProcessor
from vistarl.trainer.rollout.tokenization import TurnEncoder
from vistarl.trainer.sft import load_sft_data, run_sft, stage_schedule

REPO = Path(__file__).resolve().parent.parent
DEMO_CONFIG = REPO / "configs" / "sokoban_demo.yaml"
OPTIONS = {"grid_size": 6, "num_boxes": 1, "cell_size": 14, "max_steps": 20, "max_solution_len": 4}


@pytest.mark.parametrize("seed", range(4))
def test_a_solver_demonstration_replays_to_a_solved_level(seed: int) -> None:
    """The demonstration's replies, played on a fresh env of the same level, solve it; each reply holds
    at most `max_actions_per_turn` moves, and each observation its image, as the env shows them."""
    options = SokobanOptions.model_validate(OPTIONS)
    demo = demonstration(options, seed)
    assert demo["success"] and demo["episode_reward"] > 0
    env = SokobanEnv(options, seed)
    env.reset()
    replies = [m["content"] for m in demo["messages"] if m["role"] == "assistant"]
    observations = [m for m in demo["messages"] if m["role"] == "user"]
    assert len(observations) == len(replies)
    for message in observations:
        assert message["content"][0]["type"] == "image_url"
    terminated, info = False, {}
    for reply in replies:
        moves = re.fullmatch(r"<answer>(.*)</answer>", reply)
        assert moves is not None and len(moves.group(1).split(", ")) <= options.max_actions_per_turn
        step = env.step(reply)
        terminated, info = step.terminated, step.info
    assert terminated and info["success"]


@pytest.fixture(scope="module")
def demos_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """16 demonstrations written by the CLI, as a user writes them."""
    out = tmp_path_factory.mktemp("demos") / "demos.jsonl"
    command = vistarl_cmd(
        "sokoban", "demos", "--n", "16", "--out", str(out), "--options", json.dumps(OPTIONS)
    )
    subprocess.run(command, cwd=REPO, check=True, capture_output=True, timeout=120)
    return out


def test_the_sft_loss_mask_covers_the_replies_and_nothing_else(demos_file: Path, tiny_qwen25: Path) -> None:
    processor = VLProcessor.from_pretrained(tiny_qwen25)
    trajectories = load_sft_data(demos_file, TurnEncoder(processor))
    records = [json.loads(line) for line in demos_file.read_text().splitlines()]
    assert len(trajectories) == len(records) == 16
    for trajectory, record in zip(trajectories, records, strict=True):
        masked = [t for t, m in zip(trajectory.train_ids, trajectory.loss_mask, strict=True) if m]
        replies = [m["content"] for m in record["messages"] if m["role"] == "assistant"]
        assert processor.tokenizer.decode(masked) == "<|im_end|>".join(replies) + "<|im_end|>"


@pytest.mark.slow  # SFT for real, then the checkpoint as the policy: a minute of CPU
def test_sft_lowers_the_loss_and_its_checkpoint_loads_as_the_policy(
    demos_file: Path, tiny_qwen25: Path, tmp_path: Path
) -> None:
    overrides = [
        f"model.path={tiny_qwen25}",
        f"sft.data={demos_file}",
        "sft.epochs=6",
        "sft.batch_size=8",
        "sft.lr=1e-3",
        f"train.run_dir={tmp_path / 'sft'}",
        "logging.tensorboard=false",
        "algo.kl_loss_coef=0.05",  # a curriculum's RL terms, which SFT leaves out
        "algo.entropy_coef=0.01",
    ]
    result = run_sft(load_config(DEMO_CONFIG, overrides))
    nll = [row["train/nll"] for row in result.history]
    assert result.steps == len(nll) == 12
    assert nll[-1] < 0.8 * nll[0], nll  # from random weights, 12 steps
    tuned, base = load_lm(result.model_dir), load_lm(tiny_qwen25)
    name = "model.language_model.norm.weight"
    assert not torch.equal(tuned.state_dict()[name], base.state_dict()[name])
    assert (result.run_dir / "metrics.jsonl").is_file()


@pytest.fixture(scope="module")
def boards_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """12 boards to read, written as `vistarl demo learn` writes them for the reading stage."""
    out = tmp_path_factory.mktemp("boards") / "boards.jsonl"
    options = SokobanOptions.model_validate(OPTIONS | {"render_mode": "both"})
    assert write_transcriptions(options, 12, out) == [1] * 12
    return out


def test_a_board_to_read_is_its_image_alone_and_the_true_grid_of_that_image(boards_file: Path) -> None:
    """Each board's reply is the text grid of the very state its image shows (drawn again from the
    reply, pixel for pixel), the prompt holds the env's system prompt and the image without the grid
    (though `render_mode` is `both`), and some boards are states a few moves into their level."""
    records = [json.loads(line) for line in boards_file.read_text().splitlines()]
    moved = 0
    for offset, record in enumerate(records):
        system, user, reply = record["messages"]
        seed = TRANSCRIBE_FIRST_SEED + offset
        env = SokobanEnv(SokobanOptions.model_validate(OPTIONS), seed)
        assert record["seed"] == seed and system["content"] == env.system_prompt
        image, text = user["content"]
        assert text["text"].endswith(TRANSCRIBE_INSTRUCTION) and "#" not in text["text"]
        shown = Level.from_xsb(reply["content"])
        drawn = render_image(shown.grid, shown.boxes, shown.player, OPTIONS["cell_size"])
        pixels = decode_image(image["image_url"]["url"]).convert("RGB")
        assert pixels.tobytes() == drawn.convert("RGB").tobytes(), seed
        assert shown.grid == env.level.grid
        moved += reply["content"] != env.render_text()
    assert 0 < moved < len(records)


def test_an_sft_stage_warms_up_then_decays_as_configured() -> None:
    def factors(schedule: str, warmup: int | None) -> list[float]:
        sets = [f"sft.schedule={schedule}", "optim.warmup_steps=2"]
        cfg = load_config(DEMO_CONFIG, sets + ([] if warmup is None else [f"sft.warmup_steps={warmup}"]))
        factor = stage_schedule(cfg, 10)
        return [round(factor(done), 3) for done in range(10)]

    assert factors("constant", None) == [0.5] + [1.0] * 9  # optim.warmup_steps when sft's is unset
    assert factors("linear", 0) == [1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1]
    cosine = factors("cosine", 4)
    assert cosine[:5] == [0.25, 0.5, 0.75, 1.0, 1.0]
    assert all(a > b > 0 for a, b in itertools.pairwise(cosine[4:])) and cosine[-1] < 0.1


def test_sft_reads_boards_first_then_imitates_the_demonstrations(
    boards_file: Path, demos_file: Path, tiny_qwen25: Path, tmp_path: Path
) -> None:
    """With `sft.transcribe_data` the boards are imitated once each before the demonstrations, each
    stage with its own schedule: the learning rate warms up again when the demonstrations begin."""
    overrides = [
        f"model.path={tiny_qwen25}",
        f"sft.data={demos_file}",
        f"sft.transcribe_data={boards_file}",
        *("sft.epochs=1", "sft.batch_size=4", "sft.lr=1e-3", "sft.warmup_steps=2", "sft.schedule=linear"),
        f"train.run_dir={tmp_path / 'sft'}",
        "logging.tensorboard=false",
    ]
    result = run_sft(load_config(DEMO_CONFIG, overrides))
    assert result.steps == 3 + 4  # 12 boards, then 16 demonstrations, 4 a step
    assert [row["sft/stage"] for row in result.history] == [0, 0, 0, 1, 1, 1, 1]
    assert all(row["train/trajectories"] == 4 and row["train/nll"] > 0 for row in result.history)
    # the rate the next step takes: each stage warms up over 2 steps, then decays to 0 after its last
    lr = [row["train/lr"] / 1e-3 for row in result.history]
    assert lr == pytest.approx([1.0, 1.0, 0.0, 1.0, 1.0, 0.5, 0.0])
    assert (result.model_dir / "config.json").is_file()


def test_demo_learn_refuses_a_run_directory_that_is_a_file(tmp_path: Path) -> None:
    taken = tmp_path / "taken"
    taken.write_text("")
    result = CliRunner().invoke(app, ["demo", "learn", "--config", str(DEMO_CONFIG), "--out", str(taken)])
    assert result.exit_code == 2
    assert "is a file" in " ".join(re.sub(r"[│╭╮╰╯─]", " ", result.output).split())


@pytest.mark.parametrize("readout", [False, True], ids=["text-model", "vision-readout"])
def test_the_perception_probe_scores_every_held_out_level(
    readout: bool, tiny_qwen25: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`benchmarks.perception_probe`, cut to two steps: each evaluation picks one of the four replies for
    every held-out level, and the vision read-out reports its accuracy."""
    argv = [
        "--model",
        str(tiny_qwen25),
        *("--demos", "8", "--held-out", "5", "--epochs", "1", "--batch-size", "4", "--eval-every", "1"),
        *("--config", str(DEMO_CONFIG), "--out", str(tmp_path)),
    ]
    perception_probe.main(argv + (["--vision-readout"] if readout else []))
    lines = capsys.readouterr().out.strip().splitlines()
    if readout:
        assert [line.split()[:2] for line in lines] == [["step", "1"], ["step", "2"]], lines
        assert all(0.0 <= float(line.split("accuracy ")[1].split()[0]) <= 1.0 for line in lines)
        return
    assert lines[0].startswith("8 levels of ") and lines[0].endswith("held out: 5"), lines
    steps = [line for line in lines if line.startswith("step ")]
    assert [line.split()[1] for line in steps] == ["0", "1", "2"], lines
    for line in steps:
        picks = json.loads(line.split("picks ")[1].split("]")[0] + "]")
        assert len(picks) == 4 and sum(picks) == 5, line


def test_the_exact_mcnemar_p_value() -> None:
    assert paired_eval.mcnemar_p(0, 0) == 1.0
    assert paired_eval.mcnemar_p(10, 0) == pytest.approx(2 / 2**10)
    assert paired_eval.mcnemar_p(45, 58) == paired_eval.mcnemar_p(58, 45) == pytest.approx(0.2369, abs=1e-4)
