"""Does SFT's reading stage teach a model to read the board? Held-out transcription loss and cell accuracy.

The reading stage (`sft.transcribe_data`, docs/training.md) imitates boards to read: the board's image in,
its XSB text grid out (`transcription` in services/sokoban/demos.py). This probe writes `--boards` of them
(seeds from 1,000,000) and `--held-out` more of other levels (seeds from 3,000,000, none of a training
board's level), runs the reading stage on them as `vistarl sft` does (`Stage`, `group_towers` and
`stage_scheduler` of trainer/sft.py, so every `sft.` knob given with `--set` acts as it does there), and
every `--eval-every` steps prints the held-out NLL a token of the grid, the greedy transcriptions' cell
accuracy (every cell of the grid, then the cells inside the outer wall) and the share of boards written
exactly. Before training it prints the blind baselines: the accuracy of each cell's most common
character over the training boards, and the entropy (nats a board) of those per-cell distributions.
`--blank` replaces every image with a blank one of the same size: the same stage, image-blind.

    python -m benchmarks.reading_probe --model runs/m-tiny --set sft.transcribe_system_prompt=false
    python -m benchmarks.reading_probe --model runs/m-tiny --blank --set sft.transcribe_system_prompt=false

What it found is in docs/results.md ("Reading the board on two cores").
"""

from __future__ import annotations

import argparse
import collections
import math
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from benchmarks.harness import benchmark_parser
from benchmarks.perception_probe import probe_args
from vistarl.cli.sokoban import write_conversations
from vistarl.services.sokoban.demos import transcriptions
from vistarl.trainer.config import TrainConfig, load_config
from vistarl.trainer.learner.fsdp import rank_device
from vistarl.trainer.learner.imitation import imitate
from vistarl.trainer.learner.logprobs import token_logprobs
from vistarl.trainer.learner.models import Models, load_actor
from vistarl.trainer.learner.packing import SequenceSample, pack_sequences
from vistarl.trainer.learner.update import PolicyTrainer
from vistarl.trainer.rollout.processor import VLProcessor
from vistarl.trainer.rollout.tokenization import TurnEncoder
from vistarl.trainer.rollout.trajectory import Trajectory
from vistarl.trainer.sft import Stage, group_towers, load_sft_data, stage_scheduler

BOARDS = {"grid_size": 6, "num_boxes": 1, "cell_size": 14, "max_steps": 20, "max_solution_len": 3}
HELD_OUT_SEED = 3_000_000
MAX_NEW_TOKENS = 48
OUTSIDE_OBJECTS = "# "  # wall and floor


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--model", required=True, help="HF checkpoint (`vistarl model tiny --out DIR`).")
    parser.add_argument("--options", default="{}", help="Sokoban options (JSON) over 6x6 one-box levels.")
    parser.add_argument("--boards", type=int, default=3200, help="Training boards, each read once.")
    parser.add_argument("--held-out", type=int, default=64, help="Held-out boards (seeds from 3,000,000).")
    parser.add_argument("--eval-every", type=int, default=25, help="Optimizer steps between evaluations.")
    parser.add_argument(
        "--other-prompt",
        action="store_true",
        help="Also evaluate the held-out boards with the system prompt the other way round from training.",
    )
    parser.add_argument("--blank", action="store_true", help="Every image blank: the image-blind stage.")
    parser.add_argument("--config", type=Path, default=Path("configs/sokoban_demo.yaml"))
    parser.add_argument("--set", nargs="*", default=[], help="Config overrides, e.g. sft.lr=3e-4.")
    parser.add_argument("--out", type=Path, default=Path("runs/reading-probe"))
    return probe_args(parser, argv, BOARDS)


def boards(args: argparse.Namespace, cfg: TrainConfig, encoder: TurnEncoder) -> dict[str, list[Trajectory]]:
    """The training boards, the held-out ones (with the system prompt unless training never shows it), and
    with `--other-prompt` the held-out ones with the system prompt the other way round (`other`), as
    trajectories, each set written under `--out` first."""
    args.out.mkdir(parents=True, exist_ok=True)
    system = cfg.sft.transcribe_system_prompt
    shown = system is not False
    held = list(transcriptions(args.options, args.held_out, system_prompt=shown, first_seed=HELD_OUT_SEED))
    keys = {key for record in held for key in record["levels"]}
    records = {"train": transcriptions(args.options, args.boards, keys, system), "held-out": iter(held)}
    if args.other_prompt:
        records["other"] = transcriptions(args.options, args.held_out, frozenset(), not shown, HELD_OUT_SEED)
    sets = {}
    for name, chosen in records.items():
        path = args.out / f"{name}.jsonl"
        write_conversations(blanked(chosen) if args.blank else chosen, path)
        sets[name] = load_sft_data(path, encoder)
    return sets


def blanked(records: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """The records with each image replaced by a black one of its size."""
    for record in records:
        for message in record["messages"]:
            content = message["content"]
            if isinstance(content, list):
                for part in content:
                    if "image_url" in part:
                        part["image_url"]["url"] = Image.new("RGB", part["image_url"]["url"].size)
        yield record


def grid(trajectory: Trajectory, processor: VLProcessor) -> str:
    """The board's grid, the reply the trajectory imitates."""
    reply = [i for i, m in zip(trajectory.train_ids, trajectory.loss_mask, strict=True) if m]
    return str(processor.tokenizer.decode(reply, skip_special_tokens=True))


def cells(text: str) -> dict[tuple[int, int], str]:
    """Each character of a grid by (row, column)."""
    return {(r, c): ch for r, line in enumerate(text.split("\n")) for c, ch in enumerate(line)}


def inside(key: tuple[int, int], truth: dict[tuple[int, int], str]) -> bool:
    """Whether a cell lies inside the outer wall (not on the first or last row or column)."""
    rows = 1 + max(r for r, _ in truth)
    cols = 1 + max(c for _, c in truth)
    return 0 < key[0] < rows - 1 and 0 < key[1] < cols - 1


def accuracy(guesses: Sequence[str], truths: Sequence[str]) -> str:
    """Cell accuracy over every cell, over the cells inside the outer wall, over the cells of an object
    (player, box or target: what a blind guess of wall or floor never gets), and the share written exactly."""
    hits: dict[str, list[bool]] = {"cells": [], "inside": [], "objects": []}
    exact = 0
    for guess, truth in zip(guesses, truths, strict=True):
        got, want = cells(guess), cells(truth)
        for key, ch in want.items():
            hit = got.get(key) == ch
            hits["cells"].append(hit)
            if inside(key, want):
                hits["inside"].append(hit)
            if ch not in OUTSIDE_OBJECTS:
                hits["objects"].append(hit)
        exact += guess.strip() == truth
    shares = "  ".join(f"{name} {sum(h) / max(1, len(h)):.3f}" for name, h in hits.items())
    return f"{shares}  exact {exact / len(truths):.3f}"


def blind_baseline(train: Sequence[str], held: Sequence[str]) -> str:
    """The held-out accuracy of each cell's most common character, and the entropy of the training boards'
    per-cell distributions (nats a board)."""
    counts: dict[tuple[int, int], collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for text in train:
        for key, ch in cells(text).items():
            counts[key][ch] += 1
    mode = {key: counter.most_common(1)[0][0] for key, counter in counts.items()}
    rows = 1 + max(r for r, _ in mode)
    guess = "\n".join(
        "".join(mode.get((r, c), " ") for c in range(1 + max(c for _, c in mode))) for r in range(rows)
    )
    entropy = sum(
        -n / sum(counter.values()) * math.log(n / sum(counter.values()))
        for counter in counts.values()
        for n in counter.values()
    )
    return f"blind: {accuracy([guess] * len(held), held)}  entropy {entropy:.2f} nats a board"


@torch.no_grad()
def held_out_nll(trainer: PolicyTrainer, held: Sequence[Trajectory]) -> float:
    """Mean NLL a grid token over the held-out boards, teacher-forced."""
    samples = [SequenceSample(t.train_ids, t.loss_mask, t.images) for t in held]
    batch = pack_sequences(samples, trainer.processor, trainer.actor.model.get_rope_index, dummy_image=False)
    with trainer.autocast():
        logprobs = token_logprobs(trainer.actor, batch.to(trainer.device), 1.0).logprobs
    return float(-logprobs.sum() / batch.loss_mask.sum())


@torch.no_grad()
def transcribe(trainer: PolicyTrainer, held: Sequence[Trajectory]) -> list[str]:
    """Greedy replies to the held-out boards' prompts, all decoded together one token a pass."""
    stop = trainer.processor.ids.im_end
    prompts = [list(t.train_ids[: t.loss_mask.index(1)]) for t in held]
    replies: list[list[int]] = [[] for _ in held]
    live = list(range(len(held)))
    for _ in range(MAX_NEW_TOKENS):
        samples = [  # the last token is a placeholder: position -2 predicts the next one
            SequenceSample(
                [*prompts[i], *replies[i], stop],
                [0] * (len(prompts[i]) + len(replies[i])) + [1],
                held[i].images,
            )
            for i in live
        ]
        batch = pack_sequences(
            samples, trainer.processor, trainer.actor.model.get_rope_index, dummy_image=False
        )
        with trainer.autocast():
            picks = trainer.actor(
                **batch.to(trainer.device).forward_inputs(),
                index=batch.scored.to(trainer.device),
                score=lambda head, hidden, _: head(hidden).argmax(-1),
            )
        for i, token in zip(live, picks.tolist(), strict=True):
            replies[i].append(token)
        live = [i for i in live if replies[i][-1] != stop]
        if not live:
            break
    return [str(trainer.processor.tokenizer.decode(r, skip_special_tokens=True)) for r in replies]


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    cfg = load_config(args.config, [f"model.path={args.model}", *args.set])
    if cfg.sft.lr is not None:
        cfg = cfg.model_copy(update={"optim": cfg.optim.model_copy(update={"lr": cfg.sft.lr})})
    torch.manual_seed(cfg.train.seed)
    processor = VLProcessor.from_pretrained(args.model)
    sets = boards(args, cfg, TurnEncoder(processor))
    train, held = sets.pop("train"), sets["held-out"]
    truths = [grid(t, processor) for t in held]
    trainer = PolicyTrainer(cfg, Models(load_actor(args.model), None, None), processor, rank_device())
    group_towers(trainer)
    stage = Stage(0, "reading", train, 1)
    trainer.lr_schedulers["actor"] = stage_scheduler(cfg, trainer.actor_optimizer, stage)
    tokens, steps = len(train[0].train_ids), stage.steps(cfg)
    print(f"{len(train)} boards of {tokens} tokens, {steps} steps; held out {len(held)}")
    print(blind_baseline([grid(t, processor) for t in train], truths))
    training, losses = 0.0, []
    for step, (_, indices) in enumerate(stage.batches(cfg), 1):
        started = time.perf_counter()
        losses.append(imitate(trainer, [train[i] for i in indices])["train/nll"])
        training += time.perf_counter() - started
        if step % args.eval_every == 0 or step == stage.steps(cfg):
            nll = sum(losses) / len(losses)
            for name, shown in sets.items():
                figures = (
                    f"{held_out_nll(trainer, shown):.3f}  {accuracy(transcribe(trainer, shown), truths)}"
                )
                print(f"step {step}  train nll {nll:.3f}  {name} nll {figures}  {training:.0f}s", flush=True)
            losses = []


if __name__ == "__main__":
    main()
