"""Checkpoints: the optimizer state round-trips, and 2 steps + save + resume for 1 equal 3 straight steps.

The resume runs use the real loop and trainer with an in-process `HFEngine` on the one-turn env of
`tests.test_learning`, whose reward (the share of even token ids) differs between samples, so every step
moves the weights. The engine's samples come from the weights it was sent, so a resume that pushed the
wrong ones would train on other episodes; and the engines of both runs must end up scoring alike.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch.optim.lr_scheduler import LambdaLR

from tests.test_learning import learning_config
from tests.test_train_loop import with_changes
from vistarl.trainer.config import AlgoConfig, TrainConfig
from vistarl.trainer.learner.checkpoint import (
    TrainerState,
    latest_checkpoint,
    load_optimizer,
    load_schedulers,
    save_checkpoint,
)
from vistarl.trainer.learner.entropy_control import EntropyControl
from vistarl.trainer.learner.models import load_actor
from vistarl.trainer.learner.update import warmup
from vistarl.trainer.rollout.engines.base import GenerateRequest, GenerateResult
from vistarl.trainer.rollout.engines.hf import HFEngine
from vistarl.trainer.rollout.engines.sglang_api import SamplingParams
from vistarl.trainer.rollout.tokenization import TurnEncoder
from vistarl.trainer.run.outputs import read_metrics
from vistarl.trainer.run.train import run_training


def resume_config(checkpoint: Path, run_dir: Path, steps: int) -> TrainConfig:
    """`learning_config` at 2 prompts x 4 samples a step in 2 mini-batches, with a learning-rate warmup
    (so the schedulers' state matters too)."""
    cfg = learning_config(checkpoint, run_dir, steps)
    cfg = with_changes(cfg, "rollout", n_samples_per_prompt=4, rollout_batch_size=2, max_new_tokens=8)
    cfg = with_changes(cfg, "optim", lr=1e-3, warmup_steps=3)
    return with_changes(cfg, "train", global_batch_size=4, seed=3, save_samples=0)


async def train(cfg: TrainConfig, engine: HFEngine, resume: bool = False) -> Path:
    """Run the loop with `engine` (closed at the end); returns the run's latest checkpoint."""
    result = await run_training(cfg, resume=resume, engine=engine)
    assert result.checkpoint is not None
    return result.checkpoint


async def probe(engine: HFEngine) -> GenerateResult:
    """Eight greedy tokens and their logprobs from a fixed prompt, by a fresh engine on `engine`'s model."""
    scorer = HFEngine(engine.model, engine.processor)
    prompt = TurnEncoder(engine.processor).prompt([{"role": "user", "content": "Write anything."}])
    sampling = SamplingParams(max_new_tokens=8, temperature=0.0, ignore_eos=True)
    try:
        return await scorer.generate(GenerateRequest(engine_ids=prompt.ids, sampling=sampling))
    finally:
        await scorer.close()


def actor_weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    return load_file(str(checkpoint / "actor" / "model.safetensors"))


@pytest.mark.slow  # five training steps in two runs: minutes of CPU
async def test_resuming_after_two_steps_equals_three_straight_steps(
    tiny_qwen25: Path, tmp_path: Path
) -> None:
    straight_engine = HFEngine.from_pretrained(tiny_qwen25)
    straight = await train(resume_config(tiny_qwen25, tmp_path / "straight", 3), straight_engine)
    halfway_engine = HFEngine.from_pretrained(tiny_qwen25)
    halfway = await train(resume_config(tiny_qwen25, tmp_path / "resumed", 2), halfway_engine)
    resumed_engine = HFEngine.from_pretrained(
        tiny_qwen25
    )  # the initial weights: the resume must send its own
    resumed = await train(resume_config(tiny_qwen25, tmp_path / "resumed", 3), resumed_engine, resume=True)

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

    straight_probe, resumed_probe = await probe(straight_engine), await probe(resumed_engine)
    saved_probe = await probe(HFEngine.from_pretrained(resumed / "actor"))
    initial_probe, halfway_probe = (
        await probe(HFEngine.from_pretrained(tiny_qwen25)),
        await probe(halfway_engine),
    )
    assert resumed_probe.output_ids == straight_probe.output_ids == saved_probe.output_ids
    for other in (straight_probe, saved_probe):
        torch.testing.assert_close(
            torch.tensor(resumed_probe.logprobs), torch.tensor(other.logprobs), rtol=0, atol=1e-5
        )
    for stale in (initial_probe, halfway_probe):
        gap = max(abs(a - b) for a, b in zip(stale.logprobs, resumed_probe.logprobs, strict=False))
        assert stale.output_ids != resumed_probe.output_ids or gap > 1e-3, (
            "the probe cannot tell the steps apart"
        )


def test_optimizer_state_round_trips_through_safetensors_and_json(tiny_qwen25: Path, tmp_path: Path) -> None:
    actor = load_actor(tiny_qwen25)
    optimizer = torch.optim.AdamW(actor.parameters(), lr=1e-3, betas=(0.8, 0.9), weight_decay=0.1)
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    actor.model(input_ids=ids).last_hidden_state.square().mean().backward()
    scheduler = LambdaLR(optimizer, warmup(4))
    optimizer.step()
    scheduler.step()
    algo = AlgoConfig(entropy_coef=0.002, entropy_target=0.3)
    entropy = EntropyControl(algo)
    entropy.observe(0.1)
    path = save_checkpoint(
        tmp_path,
        TrainerState(step=1, policy_version=1, prompt_cursor=4),
        actor=actor,
        actor_optimizer=optimizer,
        hf_config=actor.config,
        source_dir=tiny_qwen25,
        schedulers={"actor": scheduler, "entropy": entropy},
    )
    assert latest_checkpoint(tmp_path) == path
    fresh = torch.optim.AdamW(actor.parameters(), lr=5.0)
    load_optimizer(path, "optimizer", actor, fresh)
    assert fresh.param_groups[0]["lr"] == pytest.approx(1e-3 * 2 / 4) and tuple(
        fresh.param_groups[0]["betas"]
    ) == (0.8, 0.9)
    fresh_scheduler = LambdaLR(fresh, warmup(4))
    fresh_entropy = EntropyControl(algo)
    load_schedulers(path, {"actor": fresh_scheduler, "entropy": fresh_entropy})
    assert fresh_entropy.coef == entropy.coef == pytest.approx(0.0025)
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


def test_keep_checkpoints_leaves_the_newest_on_disk(tiny_qwen25: Path, tmp_path: Path) -> None:
    """`train.keep_checkpoints` (save_checkpoint's `keep`): older complete checkpoints go, the newest
    stay and `latest` names the last; an unfinished staging directory is not touched."""
    actor = load_actor(tiny_qwen25)
    optimizer = torch.optim.AdamW(actor.parameters(), lr=1e-3)
    staging = tmp_path / "checkpoints" / "step-000009.partial"
    staging.mkdir(parents=True)
    for step in (1, 2, 3):
        state = TrainerState(step=step, policy_version=step, prompt_cursor=step)
        save_checkpoint(
            tmp_path,
            state,
            actor=actor,
            actor_optimizer=optimizer,
            hf_config=actor.config,
            source_dir=tiny_qwen25,
            keep=2,
        )
    kept = sorted(path.name for path in (tmp_path / "checkpoints").glob("step-*"))
    assert kept == ["step-000002", "step-000003", "step-000009.partial"]
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoints" / "step-000003"
