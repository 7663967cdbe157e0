"""The VSI training configs: PPO with a critic and GAE, 15 turns, and env options the env accepts."""

from __future__ import annotations

from pathlib import Path

import pytest

from vistarl.services.vsi import VsiOptions
from vistarl.trainer.config import load_config

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


@pytest.mark.parametrize(("name", "turns"), [("vsi.yaml", 15), ("vsi_tiny.yaml", 3)])
def test_vsi_configs_train_ppo_with_a_critic(name: str, turns: int) -> None:
    config = load_config(CONFIGS / name, [])
    assert config.env.name == "vsi" and config.algo.advantage_estimator == "gae" and config.algo.needs_critic
    options = VsiOptions.model_validate(config.env.options)
    assert options.max_turns == config.rollout.max_turns == turns and options.scene_set == "train"


def test_the_full_config_is_qwen2_5_vl_3b() -> None:
    config = load_config(CONFIGS / "vsi.yaml", [])
    assert "Qwen2.5-VL-3B" in config.model.path and config.model.arch == "qwen2_5_vl"
