"""The reading stage's knobs (docs/training.md, "A reading stage before the moves"): boards to read without
the system prompt, the vision tower's own learning rate, and the text model held still while the tower
learns first; and `benchmarks.reading_probe`, which measured them."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch
from rich.console import Console

from benchmarks import reading_probe
from vistarl.cli.demo import write_sft_data
from vistarl.cli.sokoban import write_transcriptions
from vistarl.services.sokoban.options import SokobanOptions
from vistarl.trainer.config import TrainConfig, load_config
from vistarl.trainer.learner.imitation import imitate
from vistarl.trainer.learner.models import Models, load_actor
from vistarl.trainer.learner.update import PolicyTrainer
from vistarl.trainer.rollout.processor import VLProcessor
from vistarl.trainer.rollout.tokenization import TurnEncoder
from vistarl.trainer.sft import Stage, group_towers, load_sft_data, stage_scheduler

REPO = Path(__file__).resolve().parent.parent
DEMO_CONFIG = REPO / "configs" / "sokoban_demo.yaml"
OPTIONS = {"grid_size": 6, "num_boxes": 1, "cell_size": 14, "max_steps": 20, "max_solution_len": 3}


@pytest.fixture(scope="module")
def plain_boards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """8 boards to read without the system prompt."""
    out = tmp_path_factory.mktemp("boards") / "boards.jsonl"
    write_transcriptions(SokobanOptions.model_validate(OPTIONS), 8, out, system_prompt=False)
    return out


@pytest.mark.parametrize("system_prompt", ["true", "false", "alternate"])
def test_demo_learn_writes_boards_with_the_system_prompt_only_when_asked(
    system_prompt: str, tmp_path: Path
) -> None:
    sets = ["sft.transcribe_boards=4", f"sft.transcribe_system_prompt={system_prompt}"]
    cfg = load_config(DEMO_CONFIG, sets)
    options = SokobanOptions.model_validate(cfg.env.options)
    trained = write_sft_data(cfg, options, 4, None, tmp_path, Console(file=io.StringIO()))
    assert trained.sft.transcribe_data is not None
    boards = [json.loads(line) for line in trained.sft.transcribe_data.read_text().splitlines()]
    roles = [tuple(m["role"] for m in board["messages"]) for board in boards]
    shown, plain = ("system", "user", "assistant"), ("user", "assistant")
    expected = {"true": [shown] * 4, "false": [plain] * 4, "alternate": [plain, shown] * 2}
    assert roles == expected[system_prompt]


def reading_trainer(model: Path, sets: list[str]) -> tuple[PolicyTrainer, TrainConfig]:
    """A trainer of `model` with the actor's optimizer grouped as `run_sft` groups it, and its config."""
    cfg = load_config(DEMO_CONFIG, [f"model.path={model}", "sft.batch_size=4", "optim.warmup_steps=0", *sets])
    processor = VLProcessor.from_pretrained(model)
    trainer = PolicyTrainer(cfg, Models(load_actor(model), None, None), processor, torch.device("cpu"))
    group_towers(trainer)
    return trainer, cfg


def weights(trainer: PolicyTrainer) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Copies of the text model's and the vision tower's parameters, by name."""
    text, vision = {}, {}
    for name, parameter in trainer.actor.named_parameters():
        (vision if ".visual." in f".{name}" else text)[name] = parameter.detach().clone()
    return text, vision


def changed(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> int:
    """How many of the parameters moved."""
    return sum(not torch.equal(before[name], after[name]) for name in before)


def test_the_reading_stage_trains_the_vision_tower_alone_for_freeze_text_steps(
    plain_boards: Path, tiny_qwen25: Path
) -> None:
    """With `sft.freeze_text_steps=2` the reading stage's first two steps move the vision tower and its
    merger and no parameter of the text model; the third moves the text model too. Under the
    demonstrations' stage the freeze does not apply."""
    trainer, cfg = reading_trainer(tiny_qwen25, ["sft.freeze_text_steps=2"])
    boards = load_sft_data(plain_boards, TurnEncoder(trainer.processor))
    reading = Stage(0, "reading", boards, 1)
    trainer.lr_schedulers["actor"] = stage_scheduler(cfg, trainer.actor_optimizer, reading)
    text, vision = weights(trainer)
    for batch in ([0, 1, 2, 3], [4, 5, 6, 7]):
        imitate(trainer, [boards[i] for i in batch])
    later_text, later_vision = weights(trainer)
    assert changed(text, later_text) == 0
    assert changed(vision, later_vision) > 0
    imitate(trainer, boards[:4])
    assert changed(text, weights(trainer)[0]) > 0
    demos = Stage(1, "demonstrations", boards, 1)
    rates = stage_scheduler(cfg, trainer.actor_optimizer, demos)
    assert [group["lr"] for group in trainer.actor_optimizer.param_groups] == [cfg.optim.lr] * 2
    assert rates.get_last_lr() == [cfg.optim.lr] * 2


def test_vision_lr_scale_sets_the_vision_towers_rate_in_every_stage(tiny_qwen25: Path) -> None:
    trainer, cfg = reading_trainer(tiny_qwen25, ["sft.vision_lr_scale=8", "sft.lr=1e-4"])
    groups = trainer.actor_optimizer.param_groups
    assert [group["name"] for group in groups] == ["text", "vision"]
    vision = {id(p) for p in trainer.actor.model.visual.parameters()}
    assert {id(p) for p in groups[1]["params"]} == vision
    assert len(groups[0]["params"]) + len(vision) == len(list(trainer.actor.parameters()))
    for number in (0, 1):
        stage_scheduler(cfg, trainer.actor_optimizer, Stage(number, "stage", [], 1))
        assert [group["lr"] for group in groups] == pytest.approx([cfg.optim.lr, 8 * cfg.optim.lr])


def test_the_reading_probe_prints_the_blind_baseline_and_held_out_accuracy(
    tiny_qwen25: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`benchmarks.reading_probe` cut to two steps: the blind baseline, then each step's figures on the
    held-out boards and on the same boards behind the system prompt, every share between 0 and 1."""
    argv = ["--model", str(tiny_qwen25), "--boards", "8", "--held-out", "3", "--eval-every", "1"]
    argv += ["--config", str(DEMO_CONFIG), "--out", str(tmp_path), "--blank", "--other-prompt"]
    reading_probe.main([*argv, "--set", "sft.batch_size=4", "sft.transcribe_system_prompt=false"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("8 boards of ") and lines[1].startswith("blind: cells "), lines
    steps = [(line.split()[1], line.split()[5]) for line in lines[2:]]
    assert steps == [("1", "held-out"), ("1", "other"), ("2", "held-out"), ("2", "other")], lines
    for line in lines[1:]:
        words = line.split()
        shares = [float(words[words.index(name) + 1]) for name in ("cells", "inside", "objects", "exact")]
        assert all(0.0 <= share <= 1.0 for share in shares), line
    other = [json.loads(line) for line in (tmp_path / "other.jsonl").read_text().splitlines()]
    assert all(board["messages"][0]["role"] == "system" for board in other)
