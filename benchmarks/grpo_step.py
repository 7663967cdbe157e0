"""Where a GRPO step's time goes: N steps of a config through the trainer's own loop, on one GPU or the CPU.

    .venv/bin/python -m benchmarks.grpo_step --config configs/sokoban_demo_gpu.yaml     # the GPU demo step
    .venv/bin/python -m benchmarks.grpo_step --config configs/sokoban_demo_gpu.yaml --steps 5 --warmup 2 \
        --set algo.old_logprobs=recompute --set model.compute_dtype=float32           # the reference path
    .venv/bin/python -m benchmarks.grpo_step --tiny                                    # CPU, in seconds
    .venv/bin/python -m benchmarks.grpo_step --config ... --profile out/              # torch.profiler tables

Runs `run_training` (`trainer/run/train.py`) for `--warmup` + `--steps` + 1 steps with no evaluation and no
checkpoint but the last (whose save is left out of the figures), and reads the timings the loop logs
(`metrics.jsonl`). The checkpoint of `model.path` is written first if missing (`vistarl model tiny
--shape medium`, the GPU demo's model); `--tiny` writes a `tiny` one to a temporary directory and runs
a few small steps of `configs/sokoban_demo.yaml`.

One line per part, mean seconds per step over the measured steps:
- `rollout`: generation, env and token tracks, until the step's last episode is back (`time/rollout`);
- `recompute`: the old-logprob pass without gradients (`time/recompute`; 0 when the update takes its
  old logprobs from its own forward, `algo.old_logprobs`);
- `reference`: the reference model's pass, when `algo.kl_loss_coef` > 0 (`time/reference`);
- `update`: advantages and the optimizer steps (`time/update`);
- `sync`: the new weights into the engine (`time/sync`);
- `host`: the rest of the step's wall time, from one step's log record to the next, in two lines:
  `in learner`, the learner's command outside its timed parts (handing it the trajectories, packing them
  into micro-batches and onto the device, the update's metrics), and `in loop`, the rest (submitting the
  next step's jobs, holding and releasing the engine, the rollout metrics, the logging).

Then episodes/s and training tokens/s (trainable tokens, prompt included, over the step's wall time), the
peak GPU memory of the process (trainer and embedded engine together; the largest resident set on CPU),
the embedded engine's batches (over the whole run), their mean rows and how many decoded from the static
KV cache (CUDA graphs), the mean seconds an episode spent in each part (`rollout/seconds/*`: env calls and
the reset's part of them, tokenizing, generating, in all; episodes overlap, so these are waits, not shares
of the rollout), and one JSON line with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from benchmarks.harness import benchmark_parser
from vistarl.devtools.model_shapes import SHAPES
from vistarl.devtools.tiny_checkpoint import write_tiny_checkpoint
from vistarl.trainer.config import TrainConfig, load_config
from vistarl.trainer.learner.fsdp import rank_device
from vistarl.trainer.rollout.engines.hf import HFEngine
from vistarl.trainer.rollout.processor import VLProcessor
from vistarl.trainer.run.stack import build_engine
from vistarl.trainer.run.train import run_training

PARTS = {
    "rollout": "time/rollout",
    "recompute": "time/recompute",
    "reference": "time/reference",
    "update": "time/update",
    "sync": "time/sync",
}
HOST_PARTS = ("in learner", "in loop")
EPISODE_SECONDS = "rollout/seconds/"
TINY_SETTINGS = [
    "rollout.rollout_batch_size=2",
    "rollout.n_samples_per_prompt=2",
    "rollout.concurrency=4",
    "rollout.max_new_tokens=6",
]


def step_figures(record: dict[str, float], previous: dict[str, float]) -> dict[str, float]:
    """One logged step's parts (seconds), its wall time (from the previous step's log record to its own,
    so the logging between steps counts) and its sizes; `host` is what the parts leave."""
    parts = {name: float(record.get(key, 0.0)) for name, key in PARTS.items()}
    step_s = float(record["time"]) - float(previous["time"]) - float(record.get("time/eval", 0.0))
    learner = float(record.get("time/train", 0.0)) - sum(
        parts[k] for k in ("recompute", "reference", "update")
    )
    parts["host"] = max(0.0, step_s - sum(parts.values()))
    return {
        **parts,
        "in learner": min(max(0.0, learner), parts["host"]),
        "in loop": max(0.0, parts["host"] - max(0.0, learner)),
        "step": step_s,
        "episodes": float(record.get("rollout/episodes", 0.0)),
        "train_tokens": float(record.get("train/tokens", 0.0)),
    }


def summary(history: list[dict[str, float]], warmup: int, steps: int) -> dict[str, Any]:
    """Mean figures over the measured steps (after `warmup` >= 1; the last step, which saves, is left out)."""
    measured = [
        step_figures(history[i], history[i - 1]) for i in range(warmup, min(warmup + steps, len(history)))
    ]
    if not measured:
        raise RuntimeError(f"no measured step in a history of {len(history)} steps")
    mean = {key: sum(m[key] for m in measured) / len(measured) for key in measured[0]}
    split = sorted({k for r in history for k in r if k.startswith(EPISODE_SECONDS)})
    records = history[warmup : warmup + len(measured)]
    return {
        "steps": len(measured),
        "seconds": {key: round(mean[key], 4) for key in (*PARTS, "host", "step")},
        "host_seconds": {key: round(mean[key], 4) for key in HOST_PARTS},
        "episodes": mean["episodes"],
        "train_tokens": mean["train_tokens"],
        "episodes_per_s": round(mean["episodes"] / mean["step"], 2),
        "train_tokens_per_s": round(mean["train_tokens"] / mean["step"], 1),
        "losses": {k: r[k] for r in history[warmup : warmup + 1] for k in r if k.startswith("train/")},
        "episode_seconds": {
            k.removeprefix(EPISODE_SECONDS): round(sum(r.get(k, 0.0) for r in records) / len(records), 4)
            for k in split
        },
    }


def peak_memory_gib(device: torch.device) -> float:
    """The process's peak GPU memory (allocated by torch), or on CPU its largest resident set, in GiB."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def print_report(result: dict[str, Any]) -> None:
    """The part table, the rates, and the JSON line."""
    seconds = result["seconds"]
    print(f"{'part':<10} {'s/step':>8}")
    for name in (*PARTS, "host"):
        print(f"{name:<10} {seconds[name]:8.3f}")
    for name in HOST_PARTS:
        print(f"  {name:<10} {result['host_seconds'][name]:8.3f}")
    print(f"{'step':<10} {seconds['step']:8.3f}")
    print(
        f"episodes/s {result['episodes_per_s']:.1f}  training tokens/s {result['train_tokens_per_s']:.0f}  "
        f"peak memory {result['peak_memory_gib']:.2f} GiB  ({result['device']})"
    )
    print(
        f"engine batches {result['engine_batches']}  mean rows {result['engine_mean_batch']}"
        f"  static-cache batches {result['engine_static_batches']}"
    )
    split = "  ".join(f"{k} {v:.3f}" for k, v in result["episode_seconds"].items())
    print(f"seconds per episode: {split}")
    print(json.dumps(result))


def prepared_config(args: argparse.Namespace, tmp: Path) -> TrainConfig:
    """The config with the benchmark's settings: no evaluation, one checkpoint at the end, a scratch run
    directory, and the model written if missing."""
    settings = [*(TINY_SETTINGS if args.tiny else []), *args.set]
    steps = args.warmup + args.steps + 1
    settings += [
        f"train.steps={steps}",
        "train.eval_every=0",
        "train.save_every=0",
        "train.save_samples=0",
        "train.max_time_s=null",
        f"train.run_dir={tmp / 'run'}",
        "logging.tensorboard=false",
    ]
    if args.tiny:
        settings.append(f"model.path={write_tiny_checkpoint(tmp / 'model', shape=SHAPES['tiny'])}")
    cfg = load_config(args.config, settings)
    if not Path(cfg.model.path).exists():
        write_tiny_checkpoint(cfg.model.path, arch=cfg.model.arch, shape=SHAPES[args.shape])
    return cfg


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Train, then summarize the logged steps."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg = prepared_config(args, Path(tmp))
        device = rank_device()
        path = Path(cfg.model.path)
        engine = build_engine(cfg, VLProcessor.from_pretrained(path), path, device)  # the stack's own
        train = lambda: asyncio.run(run_training(cfg, name="grpo-step", engine=engine))  # noqa: E731
        if args.profile is not None:
            from benchmarks.gpu_profile import profile_step

            box: list[Any] = []
            profile_step(lambda: box.append(train()), device, args.profile, "grpo_step")
            result = box[0]
        else:
            result = train()
        figures = summary(result.history, args.warmup, args.steps)
    stats = engine.stats if isinstance(engine, HFEngine) else None
    return {
        "engine_batches": stats.batches if stats else None,
        "engine_static_batches": stats.static_batches if stats else None,
        "engine_mean_batch": round(stats.rows / stats.batches, 1) if stats and stats.batches else None,
        "config": str(args.config),
        "settings": args.set,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "peak_memory_gib": round(peak_memory_gib(device), 3),
        **figures,
    }


def main(argv: list[str] | None = None) -> None:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--config", type=Path, default=None, help="default: configs/sokoban_demo_gpu.yaml")
    parser.add_argument("--steps", type=int, default=5, help="measured steps")
    parser.add_argument("--warmup", type=int, default=2, help="steps run first and left out")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    parser.add_argument("--tiny", action="store_true", help="the tiny model on configs/sokoban_demo.yaml")
    parser.add_argument("--shape", default="medium", choices=sorted(SHAPES), help="model written if missing")
    parser.add_argument("--profile", type=Path, default=None, help="write torch.profiler tables here")
    parser.add_argument("--json-out", type=Path, default=None, help="also write the JSON line here")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.warmup < 1:
        parser.error("--steps and --warmup must be >= 1 (a step's wall time starts at the last one's log)")
    if args.config is None:
        args.config = Path("configs/sokoban_demo.yaml" if args.tiny else "configs/sokoban_demo_gpu.yaml")
    result = run(args)
    print_report(result)
    if args.json_out is not None:
        args.json_out.write_text(json.dumps(result) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
