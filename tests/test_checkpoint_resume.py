"""Checkpoints: the optimizer state round-trips, and 2 steps + save + resume for 1 equal 3 straight steps.

The resume runs use the real loop and trainer with a `ScriptedEngine` (its replies depend only on each
job's sampling seed) and the counter env in process, so two runs see exactly the same episodes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch.optim.lr_scheduler import LambdaLR

from trainer.config import TrainConfig
from trainer.learner.checkpoint import (
    TrainerState,
    latest_checkpoint,
    load_optimizer,
    load_schedulers,
    save_checkpoint,
)
from trainer.learner.models import load_actor
from trainer.learner.update import warmup
from trainer.rollout.engines.base import GenerateRequest
from trainer.rollout.engines.scripted import ScriptedEngine
from trainer.rollout.processor import VLProcessor
from trainer.run_logging import read_metrics
from trainer.train import run_training


def odd_seeds_count(index: int, request: GenerateRequest) -> str:
    """Episodes with an odd sampling seed count up (reward 1), the others say something else (-0.1)."""
    return "inc" if (request.sampling.sampling_seed or 0) % 2 else "wait"


def scripted_config(checkpoint: Path, run_dir: Path, steps: int, save_every: int = 0) -> TrainConfig:
    return TrainConfig.model_validate(
        {
            "model": {"path": str(checkpoint), "dtype": "float32", "gradient_checkpointing": False},
            "env": {"name": "tests.envs.counter", "serve": False, "options": {"target": 1}},
            "rollout": {
                "n_samples_per_prompt": 4,
                "rollout_batch_size": 2,
                "max_turns": 1,
                "max_new_tokens": 8,
                "rollout_max_response_len": 8,
                "rollout_max_context_len": 512,
            },
            "algo": {"advantage_estimator": "grpo", "tis_cap": None},
            "optim": {"lr": 1e-3, "warmup_steps": 3},
            "train": {
                "steps": steps,
                "global_batch_size": 4,
                "micro_batch_tokens": 512,
                "seed": 3,
                "save_every": save_every,
                "save_samples": 0,
                "run_dir": str(run_dir),
            },
            "log": {"tensorboard": False},
        }
    )


async def train_scripted(cfg: TrainConfig, processor: VLProcessor, resume: bool = False) -> Path:
    """Run the loop with a fresh scripted engine; returns the run's latest checkpoint."""
    result = await run_training(cfg, resume=resume, engine=ScriptedEngine(processor, odd_seeds_count))
    assert result.checkpoint is not None
    return result.checkpoint


def actor_weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    return load_file(str(checkpoint / "actor" / "model.safetensors"))


async def test_resuming_after_two_steps_equals_three_straight_steps(
    tiny_qwen25: Path, tmp_path: Path
) -> None:
    processor = VLProcessor.from_pretrained(tiny_qwen25)
    straight = await train_scripted(scripted_config(tiny_qwen25, tmp_path / "straight", 3), processor)
    halfway = await train_scripted(scripted_config(tiny_qwen25, tmp_path / "resumed", 2), processor)
    resumed = await train_scripted(
        scripted_config(tiny_qwen25, tmp_path / "resumed", 3), processor, resume=True
    )

    assert (straight.name, halfway.name, resumed.name) == ("step-000003", "step-000002", "step-000003")
    first, second, initial = (
        actor_weights(straight),
        actor_weights(resumed),
        load_file(str(tiny_qwen25 / "model.safetensors")),
    )
    moved = max(float((first[name] - initial[name]).abs().max()) for name in first)
    assert moved > 1e-3, "training did not change the weights, so the comparison would prove nothing"
    for name, tensor in first.items():
        torch.testing.assert_close(second[name], tensor, rtol=0, atol=1e-6, msg=name)
    straight_rewards = [r["reward/mean"] for r in read_metrics(tmp_path / "straight")]
    resumed_rewards = [r["reward/mean"] for r in read_metrics(tmp_path / "resumed")]
    assert resumed_rewards == pytest.approx(straight_rewards) and len(straight_rewards) == 3
    state = json.loads((resumed / "trainer_state.json").read_text())
    assert (state["step"], state["policy_version"], state["prompt_cursor"]) == (3, 3, 6)


def test_optimizer_state_round_trips_through_safetensors_and_json(tiny_qwen25: Path, tmp_path: Path) -> None:
    actor = load_actor(tiny_qwen25)
    optimizer = torch.optim.AdamW(actor.parameters(), lr=1e-3, betas=(0.8, 0.9), weight_decay=0.1)
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    actor.model(input_ids=ids).last_hidden_state.square().mean().backward()
    scheduler = LambdaLR(optimizer, warmup(4))
    optimizer.step()
    scheduler.step()
    path = save_checkpoint(
        tmp_path,
        TrainerState(step=1, policy_version=1, prompt_cursor=4),
        actor=actor,
        actor_optimizer=optimizer,
        hf_config=actor.config,
        source_dir=tiny_qwen25,
        schedulers={"actor": scheduler},
    )
    assert latest_checkpoint(tmp_path) == path
    fresh = torch.optim.AdamW(actor.parameters(), lr=5.0)
    load_optimizer(path, "optimizer", actor, fresh)
    assert fresh.param_groups[0]["lr"] == pytest.approx(1e-3 * 2 / 4) and tuple(
        fresh.param_groups[0]["betas"]
    ) == (0.8, 0.9)
    fresh_scheduler = LambdaLR(fresh, warmup(4))
    load_schedulers(path, {"actor": fresh_scheduler})
    fresh_scheduler.step()
    scheduler.step()
    assert fresh.param_groups[0]["lr"] == optimizer.param_groups[0]["lr"] == pytest.approx(1e-3 * 3 / 4)
    trained = [p for p in actor.parameters() if optimizer.state[p]]
    assert trained, "the backward pass should have given some parameters optimizer state"
    for parameter in trained:
        before, after = optimizer.state[parameter], fresh.state[parameter]
        assert before.keys() == after.keys()
        for key in before:
            torch.testing.assert_close(after[key], before[key], rtol=0, atol=0)
