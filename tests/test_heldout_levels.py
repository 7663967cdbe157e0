"""Held out by level, not only by seed: for the demos' configs, no level of a held-out seed is in the SFT
data (demonstrations, boards to read) or among GRPO's training seeds, though many training seeds would
repeat one (docs/results.md, "Held out by level"). Small counts, so it runs in seconds on a CPU."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from rich.console import Console

from vistarl.cli.demo import write_sft_data
from vistarl.cli.sokoban import recorded_levels, write_demonstrations
from vistarl.services.sokoban.env import SokobanEnv
from vistarl.services.sokoban.game import Level
from vistarl.services.sokoban.options import SokobanOptions
from vistarl.trainer.config import TrainConfig, load_config
from vistarl.trainer.run.prompts import PromptSource

REPO = Path(__file__).resolve().parent.parent
CONFIGS = ("sokoban_demo.yaml", "sokoban_demo_gpu.yaml")
HELD_OUT = ("env.eval_seeds=[100000,100040]", "env.confirm_seeds=[200000,200040]")
COUNT = 40
LINE = re.compile(
    r"held-out levels in the SFT data: (\d+) of (\d+) \(the distinct levels of 80 held-out seeds\)"
)


def demo_config(name: str) -> TrainConfig:
    """A demo config with 40 + 40 held-out seeds and 40 boards to read."""
    return load_config(REPO / "configs" / name, [*HELD_OUT, f"sft.transcribe_boards={COUNT}"])


def levels_of(options: SokobanOptions, seeds: list[int] | range) -> list[Level]:
    """The levels the env itself plays for `seeds`."""
    return [SokobanEnv(options, seed).level for seed in seeds]


def held_out_levels(cfg: TrainConfig) -> set[Level]:
    """The levels of every held-out seed of `cfg`, as the env generates them."""
    options = SokobanOptions.model_validate(cfg.env.options)
    return set(levels_of(options, [*range(100_000, 100_040), *range(200_000, 200_040)]))


@pytest.mark.parametrize("name", CONFIGS)
def test_grpo_never_draws_a_held_out_level(name: str) -> None:
    cfg = demo_config(name)
    options = SokobanOptions.model_validate(cfg.env.options)
    held_out = held_out_levels(cfg)
    seeds = [start["seed"] for start in PromptSource(cfg).take(0, 3 * COUNT)]
    assert seeds == sorted(set(seeds)) and not set(seeds) & {
        *range(100_000, 100_040),
        *range(200_000, 200_040),
    }
    assert not set(levels_of(options, seeds)) & held_out
    skipped = sorted(set(range(seeds[-1])) - set(seeds))
    assert skipped and set(levels_of(options, skipped)) <= held_out, (
        "seeds are left out for their level alone"
    )


@pytest.mark.parametrize("name", CONFIGS)
def test_the_demos_sft_data_holds_no_held_out_level(name: str, tmp_path: Path) -> None:
    cfg = demo_config(name)
    options = SokobanOptions.model_validate(cfg.env.options)
    out = io.StringIO()
    trained = write_sft_data(cfg, options, COUNT, None, tmp_path, Console(file=out, width=80))
    found = LINE.search(out.getvalue())
    assert found is not None, out.getvalue()
    assert found.group(1) == "0" and int(found.group(2)) == len(held_out_levels(cfg))
    held_out = held_out_levels(cfg)
    demos = [json.loads(line) for line in trained.sft.data.read_text().splitlines()]
    assert [d["seed"] for d in demos] == [s["seed"] for s in PromptSource(cfg).take(0, COUNT)]
    assert not set(levels_of(options, [d["seed"] for d in demos])) & held_out
    assert trained.sft.transcribe_data is not None
    boards = [json.loads(line) for line in trained.sft.transcribe_data.read_text().splitlines()]
    shown = {Level.from_xsb(board["messages"][-1]["content"]) for board in boards}
    assert len(boards) == COUNT and not shown & held_out
    assert not set(levels_of(options, [board["seed"] for board in boards])) & held_out


def test_the_overlap_line_counts_held_out_levels_brought_by_demos_from(tmp_path: Path) -> None:
    cfg = demo_config(CONFIGS[0])
    options = SokobanOptions.model_validate(cfg.env.options)
    given = tmp_path / "given.jsonl"
    write_demonstrations(options, range(100_000, 100_010), given)
    out = io.StringIO()
    no_boards = cfg.model_copy(update={"sft": cfg.sft.model_copy(update={"transcribe_boards": 0})})
    write_sft_data(no_boards, options, COUNT, given, tmp_path, Console(file=out, width=80))
    found = LINE.search(out.getvalue())
    assert found is not None and found.group(1) == str(len(set(levels_of(options, range(100_000, 100_010)))))


def test_a_file_that_names_no_levels_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps({"messages": []}) + "\n")
    with pytest.raises(ValueError, match="line 1 names no levels"):
        recorded_levels(path)
