"""`EntropyControl`: a fixed entropy bonus stays fixed; one with a target rises below it, stops and
shrinks above it, and never leaves [0, ceiling]."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from vistarl.trainer.config import AlgoConfig
from vistarl.trainer.learner.entropy_control import EntropyControl


def test_a_fixed_bonus_ignores_the_entropy() -> None:
    control = EntropyControl(AlgoConfig(entropy_coef=0.003))
    for entropy in (0.01, 5.0, 0.01):
        control.observe(entropy)
        assert control.coef == 0.003


def test_with_a_target_the_bonus_rises_below_it_and_is_off_and_shrinking_above_it() -> None:
    control = EntropyControl(
        AlgoConfig(entropy_coef=0.003, entropy_target=0.3, entropy_coef_step=0.001, entropy_coef_max=0.005)
    )
    assert control.coef == 0.003, "the first update has the configured weight"
    coefs = []
    for entropy in (0.1, 0.1, 0.1, 0.5, 0.5, 0.2):
        control.observe(entropy)
        coefs.append(control.coef)
    assert coefs == pytest.approx([0.004, 0.005, 0.005, 0.0, 0.0, 0.004])
    for _ in range(10):
        control.observe(1.0)
    assert control.level == 0.0 and control.coef == 0.0
    control.observe(0.0)
    assert control.coef == pytest.approx(0.001)


def test_its_state_round_trips() -> None:
    algo = AlgoConfig(entropy_coef=0.002, entropy_target=0.3)
    control = EntropyControl(algo)
    control.observe(0.9)
    restored = EntropyControl(algo)
    restored.load_state_dict(control.state_dict())
    assert (restored.level, restored.coef) == (control.level, control.coef) == (pytest.approx(0.0015), 0.0)


def test_a_start_above_the_ceiling_is_refused() -> None:
    with pytest.raises(ValidationError, match="entropy_coef_max"):
        AlgoConfig(entropy_coef=0.05, entropy_target=0.3)
    AlgoConfig(entropy_coef=0.05)  # a fixed bonus has no ceiling
