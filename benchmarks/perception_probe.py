"""Does SFT teach a model to read the board? Held-out answer accuracy on one-move Sokoban, while it trains.

Levels one move from solved have one right answer among four, `<answer>Dir</answer>`. The probe writes solver
demonstrations (`vistarl sokoban demos`), fine-tunes `--model` on them with `imitate`
(`trainer/learner/imitation.py`, the path `vistarl sft` takes), and every `--eval-every` steps scores the four
possible replies of each held-out level by their logprob under the model. It prints the accuracy of the
best-scored reply, the mean NLL of the right one over the four (ln 4 = 1.386 for a model that cannot tell them
apart), and how often each direction was picked: a model that does not read the board picks one direction
everywhere. With `--vision-readout` it trains the vision tower alone, with a linear layer on its image
features in place of the text model, and prints the held-out accuracy of that read-out: whether the tower can
see the answer at all.

    python -m benchmarks.perception_probe --model runs/demo-model-tiny --options '{"render_mode": "both"}'
    python -m benchmarks.perception_probe --model runs/demo-model-tiny --vision-readout

This is how the CPU demo's curriculum was chosen (docs/results.md, "Choosing the CPU curriculum").
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from benchmarks.harness import benchmark_parser
from vistarl.cli.sokoban import write_demonstrations
from vistarl.services.sokoban.actions import parse_actions
from vistarl.services.sokoban.levels import seed_key
from vistarl.services.sokoban.options import SokobanOptions
from vistarl.trainer.config import load_config
from vistarl.trainer.learner.fsdp import rank_device
from vistarl.trainer.learner.imitation import imitate
from vistarl.trainer.learner.logprobs import sequence_logprobs
from vistarl.trainer.learner.models import Models, load_actor
from vistarl.trainer.learner.update import PolicyTrainer
from vistarl.trainer.rollout.processor import VLProcessor
from vistarl.trainer.rollout.tokenization import TokenTracks, TurnEncoder
from vistarl.trainer.sft import load_sft_data

DIRECTIONS = ("Up", "Down", "Left", "Right")
ONE_MOVE = {"grid_size": 6, "num_boxes": 1, "cell_size": 14, "max_steps": 20, "max_solution_len": 1}
HELD_OUT_SEED = 100_000

Conversation = list[dict[str, Any]]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--model", required=True, help="HF checkpoint (`vistarl model tiny --out DIR`).")
    parser.add_argument("--options", default="{}", help="Sokoban options (JSON) over one-move 6x6 levels.")
    parser.add_argument(
        "--demos", type=int, default=600, help="Training levels (the first N seeds of no held-out level)."
    )
    parser.add_argument("--held-out", type=int, default=100, help="Held-out levels (seeds from 100000).")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--eval-every", type=int, default=20, help="Optimizer steps between evaluations.")
    parser.add_argument("--no-system-prompt", action="store_true", help="Leave the system prompt out.")
    parser.add_argument(
        "--vision-readout", action="store_true", help="Train the vision tower with a linear read-out."
    )
    parser.add_argument("--config", type=Path, default=Path("configs/sokoban_demo.yaml"))
    parser.add_argument("--out", type=Path, default=Path("runs/perception-probe"))
    return probe_args(parser, argv, ONE_MOVE)


def probe_args(
    parser: argparse.ArgumentParser, argv: list[str] | None, defaults: dict[str, Any]
) -> argparse.Namespace:
    """A probe's arguments, `--options` (JSON) laid over `defaults` as `SokobanOptions`; bad JSON, options
    the env refuses, or a `--model` that is no directory end the command with the parser's error."""
    args = parser.parse_args(argv)
    try:
        args.options = SokobanOptions.model_validate(defaults | json.loads(args.options))
    except ValueError as exc:  # bad JSON, or options the env refuses
        parser.error(f"--options: {exc}")
    if not Path(args.model).is_dir():
        parser.error(f"--model {args.model}: no such checkpoint directory")
    return args


def conversations(
    options: SokobanOptions, seeds: Sequence[int], path: Path, system: bool
) -> list[Conversation]:
    """The demonstrations of `seeds`, written to `path` (the SFT data) and returned as message lists."""
    write_demonstrations(options, seeds, path)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    if not system:
        for record in records:
            record["messages"] = [m for m in record["messages"] if m["role"] != "system"]
        path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return [record["messages"] for record in records]


def answer(messages: Conversation) -> int:
    """Index in DIRECTIONS of the demonstration's one move, read by the env's own parser."""
    (move,) = parse_actions(messages[-1]["content"], limit=1)
    return DIRECTIONS.index(move.capitalize())


@torch.no_grad()
def evaluate(trainer: PolicyTrainer, encoder: TurnEncoder, held_out: list[Conversation]) -> str:
    """Accuracy, NLL of the right reply among the four, and the picks per direction, on `held_out`."""
    picks, right, nll = [0] * len(DIRECTIONS), 0, 0.0
    for messages in held_out:
        scores = []
        for direction in DIRECTIONS:
            reply = {"role": "assistant", "content": f"<answer>{direction}</answer>"}
            tracks = TokenTracks.from_conversation(encoder, [*messages[:-1], reply])
            logprobs = sequence_logprobs(
                trainer.actor, trainer.processor, tracks.train_ids, tracks.images, 1.0, mask=tracks.loss_mask
            )
            scores.append(float(logprobs.sum()))
        ranked = torch.tensor(scores)
        best, truth = int(ranked.argmax()), answer(messages)
        picks[best] += 1
        right += best == truth
        nll -= float(torch.log_softmax(ranked, 0)[truth])
    return f"accuracy {right / len(held_out):.3f}  nll {nll / len(held_out):.3f}  picks {picks}"


def vision_readout(args: argparse.Namespace, train: list[Conversation], held_out: list[Conversation]) -> None:
    """Train the vision tower and a linear layer on its flattened image features to give the answer;
    print held-out accuracy every `--eval-every` steps (batches of `--batch-size` training levels)."""
    processor, actor = VLProcessor.from_pretrained(args.model), load_actor(args.model)

    def features(levels: list[Conversation]) -> torch.Tensor:
        images = [
            part["image_url"]["url"] for m in levels for part in m[-2]["content"] if "image_url" in part
        ]
        if len(images) != len(levels):
            raise SystemExit(
                "--vision-readout needs an image in every observation (render_mode vision or both)"
            )
        pixels = processor.pixel_inputs(images)
        encoded = actor.encode_images(pixels.pixel_values, pixels.image_grid_thw.tolist()).embeds
        return encoded.reshape(len(levels), -1)

    head = torch.nn.Linear(features(held_out[:1]).shape[1], len(DIRECTIONS))
    optimizer = torch.optim.AdamW([*actor.model.visual.parameters(), *head.parameters()], lr=args.lr)
    truth = torch.tensor([answer(m) for m in held_out])
    started = time.perf_counter()
    for step in range(1, args.epochs * len(train) // args.batch_size + 1):
        batch = [train[i] for i in torch.randint(len(train), (args.batch_size,)).tolist()]
        loss = torch.nn.functional.cross_entropy(
            head(features(batch)), torch.tensor([answer(m) for m in batch])
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % args.eval_every == 0:
            with torch.no_grad():
                accuracy = float((head(features(held_out)).argmax(-1) == truth).float().mean())
            elapsed = time.perf_counter() - started
            print(f"step {step}  loss {loss.item():.3f}  accuracy {accuracy:.3f}  {elapsed:.0f}s", flush=True)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    options: SokobanOptions = args.options
    args.out.mkdir(parents=True, exist_ok=True)
    system = not args.no_system_prompt
    held_seeds = range(HELD_OUT_SEED, HELD_OUT_SEED + args.held_out)
    held_levels = {seed_key(options, seed) for seed in held_seeds} - {None}  # None: a fixed level
    fresh = (seed for seed in itertools.count() if seed_key(options, seed) not in held_levels)
    train = conversations(
        options, list(itertools.islice(fresh, args.demos)), args.out / "train.jsonl", system
    )
    held_out = conversations(options, held_seeds, args.out / "held-out.jsonl", system)
    if args.vision_readout:
        vision_readout(args, train, held_out)
        return
    cfg = load_config(args.config, [f"model.path={args.model}", f"optim.lr={args.lr}"])
    processor = VLProcessor.from_pretrained(args.model)
    encoder = TurnEncoder(processor)
    data = load_sft_data(args.out / "train.jsonl", encoder)
    trainer = PolicyTrainer(cfg, Models(load_actor(args.model), None, None), processor, rank_device())
    print(f"{len(data)} levels of {len(data[0].train_ids)} tokens; held out: {len(held_out)}", flush=True)
    print(f"step 0  {evaluate(trainer, encoder, held_out)}", flush=True)
    started, step = time.perf_counter(), 0
    for epoch in range(args.epochs):
        order = torch.randperm(len(data), generator=torch.Generator().manual_seed(epoch)).tolist()
        for start in range(0, len(data), args.batch_size):
            metrics = imitate(trainer, [data[i] for i in order[start : start + args.batch_size]])
            step += 1
            if step % args.eval_every == 0:
                elapsed = time.perf_counter() - started
                print(
                    f"step {step}  loss {metrics['train/nll']:.3f}  "
                    f"{evaluate(trainer, encoder, held_out)}  {elapsed:.0f}s",
                    flush=True,
                )


if __name__ == "__main__":
    main()
