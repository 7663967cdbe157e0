"""One `PolicyTrainer.update` of the tiny actor, reference and critic on a fixed batch (`tests/test_fsdp.py`).

    torchrun --nproc-per-node 2 tests/fsdp_worker.py CHECKPOINT OUT_DIR TOKENS   # FSDP2 over 2 ranks (gloo)
    torchrun --nproc-per-node 1 tests/fsdp_worker.py CHECKPOINT OUT_DIR TOKENS   # FSDP2 on one rank
    python tests/fsdp_worker.py CHECKPOINT OUT_DIR TOKENS                         # plain modules
    torchrun --nproc-per-node 1 tests/fsdp_worker.py CHECKPOINT OUT_DIR TOKENS train.optimizer_offload=critic

The update is PPO with a critic (GAE), a KL term and an entropy bonus, two epochs of two mini-batches,
each split into micro-batches of at most TOKENS tokens (on one rank the trainer keeps gathered weights
from micro-batch to micro-batch). Rank 0 writes the metrics with `world`, the number of ranks (0
without torchrun), to `metrics.json`, and the updated actor and critic (keys prefixed `actor.` and
`critic.`) to `weights.safetensors`, in OUT_DIR. Arguments after TOKENS are config overrides.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors.torch import save_file

from tests.learner_batches import conversation, trajectory
from vistarl.trainer.config import TrainConfig
from vistarl.trainer.learner.fsdp import full_state_dict, init_distributed, rank_device
from vistarl.trainer.learner.models import Models, load_actor, load_critic, load_reference
from vistarl.trainer.learner.update import PolicyTrainer
from vistarl.trainer.overrides import apply_overrides
from vistarl.trainer.rollout.processor import VLProcessor
from vistarl.trainer.rollout.tokenization import TurnEncoder
from vistarl.trainer.rollout.trajectory import Trajectory


def update_config(checkpoint: Path, micro_batch_tokens: int, overrides: Sequence[str] = ()) -> TrainConfig:
    """Six trajectories a step in mini-batches of three, at most `micro_batch_tokens` a micro-batch, then
    `overrides` (`section.key=value`)."""
    raw: dict[str, Any] = {
        "model": {"path": str(checkpoint), "dtype": "float32", "gradient_checkpointing": True},
        "rollout": {
            "n_samples_per_prompt": 3,
            "rollout_batch_size": 2,
            "max_new_tokens": 16,
            "rollout_max_response_len": 32,
            "rollout_max_context_len": micro_batch_tokens,
            "rollout_temperature": 0.9,
        },
        "algo": {
            "advantage_estimator": "gae",
            "lam": 0.9,
            "kl_loss_coef": 0.1,
            "entropy_coef": 0.01,
            "ppo_epochs": 2,
            "tis_cap": None,
        },
        "optim": {"lr": 1e-3, "critic_lr": 1e-3},
        "train": {
            "global_batch_size": 3,
            "micro_batch_tokens": micro_batch_tokens,
            "vision_pass_micro_batches": 2,
        },
    }
    apply_overrides(raw, list(overrides), TrainConfig)
    return TrainConfig.model_validate(raw)


def update_batch(encoder: TurnEncoder) -> list[Trajectory]:
    """Six trajectories of different lengths, one or two turns, one of them with an image: in the
    micro-step that holds it, one rank encodes it and the other runs the vision tower on a dummy, and
    the other mini-batch has no image at all."""
    plays = [
        (["left", "right then up"], 1.0, (56, 56)),
        (["down"], 0.0, None),
        (["up, up and away", "stay"], 0.5, None),
        (["wait"], 0.2, None),
        (["right"], 0.8, None),
        (["left, then down twice"], 0.0, None),
    ]
    return [
        trajectory(
            encoder, conversation("Where to?", replies, image_size=size), f"e{i}", f"g{i // 3}", reward
        )
        for i, (replies, reward, size) in enumerate(plays)
    ]


def train_step(
    checkpoint: Path, out_dir: Path, micro_batch_tokens: int, overrides: Sequence[str] = ()
) -> None:
    """Build the trainer (sharded under torchrun), take one update, write its metrics and weights."""
    torch.manual_seed(0)
    distributed = init_distributed(timeout=timedelta(seconds=60))
    processor = VLProcessor.from_pretrained(checkpoint)
    models = Models(load_actor(checkpoint), load_reference(checkpoint), load_critic(checkpoint))
    trainer = PolicyTrainer(
        update_config(checkpoint, micro_batch_tokens, overrides), models, processor, rank_device()
    )
    metrics = trainer.update(1, update_batch(TurnEncoder(processor)))
    assert trainer.critic is not None
    weights = {f"actor.{k}": v for k, v in full_state_dict(trainer.actor).items()}
    weights |= {f"critic.{k}": v for k, v in full_state_dict(trainer.critic).items()}
    if not distributed or dist.get_rank() == 0:
        out_dir.mkdir(parents=True, exist_ok=True)
        save_file(
            {k: v.clone().contiguous() for k, v in weights.items()}, str(out_dir / "weights.safetensors")
        )
        world = dist.get_world_size() if distributed else 0
        (out_dir / "metrics.json").write_text(json.dumps({"world": world, **metrics}))
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    train_step(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4:])
