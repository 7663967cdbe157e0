"""AdamW with bfloat16 moments (`trainer/learner/optimizers.py`): its rounding, its steps against torch's
AdamW, its state through a checkpoint, and a PPO update with it against one with float32 moments."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.test_update import encoder, make_trainer, one_group, processor, trainer_config  # noqa: F401
from vistarl.trainer.config import OptimConfig
from vistarl.trainer.learner.optimizers import BFloat16AdamW, build_optimizer, stochastic_bfloat16
from vistarl.trainer.rollout.processor import VLProcessor
from vistarl.trainer.rollout.tokenization import TurnEncoder


def test_stochastic_rounding_lands_on_a_neighbour_and_keeps_the_mean() -> None:
    """Each rounding is one of the two bfloat16 values around the input, taken in proportion to the
    distance: the mean of many is the input, where rounding to nearest is off by the bias it always has."""
    value = torch.tensor([1.0 + 3 * 2**-10, -0.001234, 5e-30])  # none representable in bfloat16
    draws = torch.stack(
        [stochastic_bfloat16(value.clone(), torch.Generator().manual_seed(i)).float() for i in range(4000)]
    )
    down = value.bfloat16().float()
    for column, x in enumerate(value.tolist()):
        seen = set(draws[:, column].tolist())
        assert len(seen) == 2 and min(seen) < x < max(seen)
        assert draws[:, column].mean().item() == pytest.approx(x, rel=2e-3)
        assert abs(draws[:, column].mean().item() - x) < abs(down[column].item() - x)


def regression(bfloat16: bool, steps: int) -> tuple[torch.Tensor, list[float]]:
    """A seeded linear regression trained by AdamW, with bfloat16 moments or torch's, for `steps` steps:
    the weights and the losses."""
    generator = torch.Generator().manual_seed(0)
    inputs, targets = torch.randn(64, 32, generator=generator), torch.randn(64, 4, generator=generator)
    layer = torch.nn.Linear(32, 4)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(4, 32, generator=generator) * 0.1)
        layer.bias.zero_()
    optimizer: torch.optim.Optimizer = (
        BFloat16AdamW(layer.parameters(), lr=1e-2, betas=(0.9, 0.999), weight_decay=0.01)
        if bfloat16
        else torch.optim.AdamW(layer.parameters(), lr=1e-2, betas=(0.9, 0.999), weight_decay=0.01)
    )
    losses = []
    for _ in range(steps):
        loss = torch.nn.functional.mse_loss(layer(inputs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return layer.weight.detach(), losses


def test_bfloat16_moments_step_like_torchs_adamw() -> None:
    (ours, our_losses), (torchs, torch_losses) = regression(True, 60), regression(False, 60)
    assert our_losses[0] == torch_losses[0] and our_losses[-1] < 0.7 * our_losses[0]
    assert our_losses == pytest.approx(torch_losses, rel=2e-3)
    assert ((ours - torchs).norm() / torchs.norm()).item() < 1e-2


def test_the_moments_stay_bfloat16_through_a_checkpoint() -> None:
    layer = torch.nn.Linear(8, 2)
    optimizer = build_optimizer(layer.parameters(), 1e-3, OptimConfig(), "bfloat16", seed=0)
    layer(torch.ones(3, 8)).sum().backward()
    optimizer.step()
    saved = optimizer.state_dict()
    restored = build_optimizer(layer.parameters(), 1e-3, OptimConfig(), "bfloat16", seed=0)
    restored.load_state_dict(saved)  # torch casts every state tensor to its parameter's dtype
    for state in restored.state.values():
        assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.bfloat16
        assert int(state["step"]) == 1
    assert (
        type(build_optimizer(layer.parameters(), 1e-3, OptimConfig(), "float32", seed=0)) is torch.optim.AdamW
    )


def test_ppo_with_bfloat16_moments_has_the_losses_of_float32_moments(
    tiny_qwen25: Path,
    processor: VLProcessor,  # noqa: F811
    encoder: TurnEncoder,  # noqa: F811
) -> None:
    """Two GAE updates, actor and critic, on one batch: the same losses step by step, to bfloat16's
    rounding of the moments."""
    losses = {}
    for dtype in ("float32", "bfloat16"):
        cfg = trainer_config(tiny_qwen25, 4, algo={"advantage_estimator": "gae", "lam": 0.9})
        cfg.train.optimizer_state_dtype = dtype
        trainer = make_trainer(cfg, processor, nudge=0.02)
        batch = one_group(encoder, [1.0, 0.0, 0.5, 0.0])
        steps = [trainer.update(step, batch) for step in (1, 2)]
        losses[dtype] = [(m["train/pg_loss"], m["train/vf_loss"]) for m in steps]
    assert losses["bfloat16"][0] == losses["float32"][0]  # the first losses come before any step
    assert losses["float32"][1][1] < losses["float32"][0][1], "the critic did not learn: nothing compared"
    for ours, theirs in zip(losses["bfloat16"], losses["float32"], strict=True):
        assert ours == pytest.approx(theirs, rel=2e-2, abs=1e-4)
