"""Supervised fine-tuning on multi-turn conversations, through the same path as RL.

`run_sft(cfg)`:

1. reads `sft.data`: a JSONL of demonstrations (`{"messages": [...]}` with images as data URLs, as
   `vistarl sokoban demos` writes) or of trajectories (as `vistarl rollout` writes);
2. turns each demonstration into a `Trajectory` with the policy's own token tracks
   (`TokenTracks.from_conversation`), so the loss mask covers the assistant's tokens and nothing else;
3. with `sft.transcribe_data` set, first runs the reading stage: each board of that JSONL (the image
   in, its text grid out) imitated once, `sft.batch_size` a step;
4. for `sft.epochs` epochs, shuffles them (reproducibly per epoch) and takes `sft.batch_size` per
   optimizer step: `imitate` (`trainer/learner/imitation.py`), the NLL of the assistant tokens over the
   same packing, micro-batches, FSDP sharding, clipping and optimizer as the RL update; each stage has
   its own learning-rate schedule (`sft.warmup_steps`, then `sft.schedule`: constant or decaying), the
   vision tower's rate `sft.vision_lr_scale` times the text model's, and the reading stage may hold the
   text model still over its first `sft.freeze_text_steps` (`stage_scheduler`);
5. logs every step (metrics.jsonl, the loss curve, TensorBoard; `sft/stage` is 0 while reading, 1 on
   `sft.data`) and saves a checkpoint at the end, whose `actor/` directory is an HF checkpoint that
   `model.path` takes as the RL policy.

Under torchrun every rank reads the same file and takes the same batches; each trains its share.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from rich.console import Console
from torch.optim.lr_scheduler import LambdaLR

from vistarl.trainer.config import TrainConfig
from vistarl.trainer.learner.checkpoint import TrainerState, save_checkpoint
from vistarl.trainer.learner.fsdp import init_distributed, is_distributed, rank_device
from vistarl.trainer.learner.imitation import imitate
from vistarl.trainer.learner.models import Models, load_actor
from vistarl.trainer.learner.update import PolicyTrainer, warmup
from vistarl.trainer.rollout.processor import VLProcessor
from vistarl.trainer.rollout.tokenization import TokenTrackError, TokenTracks, TurnEncoder
from vistarl.trainer.rollout.trajectory import Status, Trajectory
from vistarl.trainer.run.directory import agreed_run_dir
from vistarl.trainer.run.outputs import RunLogger
from vistarl.trainer.run.ranks import current_rank
from vistarl.trainer.seeds import permutation

__all__ = [
    "SFTResult",
    "Stage",
    "group_towers",
    "load_sft_data",
    "run_sft",
    "stage_schedule",
    "stage_scheduler",
]

TEXT_GROUP, VISION_GROUP = "text", "vision"


@dataclass
class SFTResult:
    """What a finished SFT run reports; `model_dir` is the HF checkpoint to train or serve next."""

    run_dir: Path
    steps: int
    history: list[dict[str, float]]
    model_dir: Path


def load_sft_data(path: Path, encoder: TurnEncoder, min_reward: float | None = None) -> list[Trajectory]:
    """The trajectories of a JSONL file, demonstrations tokenized with `encoder`; a bad line is a
    `ValueError` naming it. Trajectories without a generated token, or below `min_reward`, are left out."""
    kept = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                trajectory = _trajectory(json.loads(line), encoder, number)
            except (ValueError, TokenTrackError) as exc:
                raise ValueError(f"{path} line {number}: {exc}") from None
            if trajectory.trainable and (min_reward is None or trajectory.episode_reward >= min_reward):
                kept.append(trajectory)
    if not kept:
        raise ValueError(f"{path} holds no trajectory to learn from")
    return kept


def _trajectory(record: Any, encoder: TurnEncoder, number: int) -> Trajectory:
    """A trajectory record as it is, or a demonstration's conversation tokenized into one."""
    if not isinstance(record, dict):
        raise ValueError(f"expected a JSON object, got {type(record).__name__}")
    if "train_ids" in record:
        return Trajectory.from_dict(record)
    messages = record.get("messages")
    if not isinstance(messages, list):
        raise ValueError("expected a trajectory (with train_ids) or a demonstration (with messages)")
    episode_id = str(record.get("episode_id", f"demo-{number}"))
    return Trajectory.from_tracks(
        TokenTracks.from_conversation(encoder, messages),
        episode_id=episode_id,
        group_id=episode_id,
        policy_version=0,
        status=Status.COMPLETED,
        env=str(record.get("env", "")),
        seed=record.get("seed"),
        episode_reward=float(record.get("episode_reward", 0.0)),
    )


@dataclass(frozen=True)
class Stage:
    """One SFT stage: the trajectories it imitates, and how many times each; `number` is what
    `sft/stage` logs (0 the reading stage, 1 the demonstrations')."""

    number: int
    name: str
    data: list[Trajectory]
    epochs: int

    def batches(self, cfg: TrainConfig) -> Iterator[tuple[int, list[int]]]:
        """(epoch, indices) of every optimizer step: each epoch a fresh reproducible shuffle, cut into
        `sft.batch_size` pieces (the last one may be smaller)."""
        size = cfg.sft.batch_size
        for epoch in range(self.epochs):
            order = permutation(len(self.data), cfg.train.seed, epoch)
            for start in range(0, len(self.data), size):
                yield epoch, order[start : start + size]

    def steps(self, cfg: TrainConfig) -> int:
        """The stage's optimizer steps."""
        return self.epochs * math.ceil(len(self.data) / cfg.sft.batch_size)


def stage_schedule(cfg: TrainConfig, steps: int) -> Callable[[int], float]:
    """`LambdaLR`'s factor for one stage of `steps` optimizer steps: linear warmup over
    `sft.warmup_steps` (None: `optim.warmup_steps`), then `sft.schedule`: constant, or a linear or
    half-cosine decay that reaches zero one step after the stage's last."""
    start = cfg.optim.warmup_steps if cfg.sft.warmup_steps is None else cfg.sft.warmup_steps
    ramp, shape = warmup(start), cfg.sft.schedule

    def factor(done: int) -> float:
        progress = min(1.0, max(0.0, (done - start) / max(1, steps - start)))
        decay = {
            "constant": 1.0,
            "linear": 1.0 - progress,
            "cosine": 0.5 * (1 + math.cos(math.pi * progress)),
        }
        return ramp(done) * decay[shape]

    return factor


def group_towers(trainer: PolicyTrainer) -> None:
    """Give the actor's optimizer two parameter groups, the text model (with `lm_head`) first and the
    vision tower (with its merger) second, so that `stage_scheduler` can set each one's rate."""
    vision = {id(p) for p in trainer.actor.model.visual.parameters()}
    parameters = list(trainer.actor.parameters())
    trainer.regroup_actor(
        {
            TEXT_GROUP: [p for p in parameters if id(p) not in vision],
            VISION_GROUP: [p for p in parameters if id(p) in vision],
        }
    )


def stage_scheduler(cfg: TrainConfig, optimizer: torch.optim.Optimizer, stage: Stage) -> LambdaLR:
    """The rates of one stage: `stage_schedule` for each group, times `sft.vision_lr_scale` for the
    vision tower's, and 0 for the text model's over the reading stage's first `sft.freeze_text_steps`."""
    schedule = stage_schedule(cfg, stage.steps(cfg))
    frozen = cfg.sft.freeze_text_steps if stage.number == 0 else 0

    def text(done: int) -> float:
        return 0.0 if done < frozen else schedule(done)

    def vision(done: int) -> float:
        return cfg.sft.vision_lr_scale * schedule(done)

    rates = {TEXT_GROUP: text, VISION_GROUP: vision}
    return LambdaLR(optimizer, [rates[group.get("name", TEXT_GROUP)] for group in optimizer.param_groups])


def run_sft(cfg: TrainConfig, *, name: str = "sft", console: Console | None = None) -> SFTResult:
    """Fine-tune `model.path` on `sft.data` as the module docstring says; returns on every rank."""
    data_path = cfg.sft.data
    if data_path is None:
        raise ValueError("sft.data is not set: give the JSONL of demonstrations or trajectories to imitate")
    cfg.model.check_arch()
    init_distributed()
    rank = current_rank()
    device = rank_device()
    run_dir = agreed_run_dir(cfg, name, False)
    torch.manual_seed(cfg.train.seed)
    if cfg.sft.lr is not None:
        cfg = cfg.model_copy(update={"optim": cfg.optim.model_copy(update={"lr": cfg.sft.lr})})
    # the NLL alone: a curriculum's config may weigh RL terms (KL to a reference, entropy) that SFT lacks
    nll_only = cfg.algo.model_copy(update={"kl_loss_coef": 0.0, "entropy_coef": 0.0})
    cfg = cfg.model_copy(update={"algo": nll_only})
    processor = VLProcessor.from_pretrained(cfg.model.path)
    encoder = TurnEncoder(processor)
    stages = [
        Stage(1, "demonstrations", load_sft_data(data_path, encoder, cfg.sft.min_reward), cfg.sft.epochs)
    ]
    if cfg.sft.transcribe_data is not None:
        stages.insert(0, Stage(0, "reading", load_sft_data(cfg.sft.transcribe_data, encoder), 1))
    trainer = PolicyTrainer(cfg, Models(load_actor(cfg.model.path), None, None), processor, device)
    group_towers(trainer)
    total = sum(stage.steps(cfg) for stage in stages)
    logger = None
    if rank == 0:
        logger = RunLogger(
            run_dir,
            cfg.model_dump(mode="json"),
            total_steps=total,
            tensorboard=cfg.logging.tensorboard,
            wandb=cfg.logging.wandb,
            console=console or Console(),
        )
        for stage in stages:
            logger.note(f"SFT {stage.name}: {len(stage.data)} trajectories, {stage.steps(cfg)} steps")
        logger.note(f"SFT on {data_path}; run directory: {run_dir}")
    try:
        step = 0
        for stage in stages:
            trainer.lr_schedulers["actor"] = stage_scheduler(cfg, trainer.actor_optimizer, stage)
            for epoch, indices in stage.batches(cfg):
                metrics = imitate(trainer, [stage.data[i] for i in indices])
                step += 1
                if logger is not None:
                    logger.log_step(
                        step, {**metrics, "sft/epoch": float(epoch), "sft/stage": float(stage.number)}
                    )
        checkpoint = save_checkpoint(
            run_dir,
            TrainerState(step=total, policy_version=0, prompt_cursor=0),
            actor=trainer.actor,
            actor_optimizer=trainer.actor_optimizer,
            hf_config=trainer.actor.config,
            source_dir=Path(cfg.model.path),
            schedulers=trainer.schedulers,
            rank=rank,
            barrier=dist.barrier if is_distributed() else None,
        )
    finally:
        if logger is not None:
            logger.close()
    history = logger.history if logger is not None else []
    return SFTResult(run_dir, total, history, checkpoint / "actor")
