"""The shipped Geo3k training configs: valid for the trainer and the env, with the seed's budgets."""

from __future__ import annotations

from pathlib import Path

import pytest

from vistarl.services.env_api import load_env_factory
from vistarl.services.geo3k import Geo3kOptions
from vistarl.trainer.config import load_config

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


@pytest.mark.parametrize("name", ["geo3k.yaml", "geo3k_tiny.yaml"])
def test_env_options_validate_and_agree_with_the_rollout_turns(name: str) -> None:
    cfg = load_config(CONFIGS / name, [])
    options = load_env_factory(cfg.env.name).options_model.model_validate(cfg.env.options)
    assert isinstance(options, Geo3kOptions) and options.max_turns == cfg.rollout.max_turns == 3
    assert cfg.env.options["calc_score"] == options.calc_score == "oracle"  # said, as docs/geo3k.md tells


def test_the_full_config_keeps_the_seed_budgets() -> None:
    cfg = load_config(CONFIGS / "geo3k.yaml", [])
    assert (cfg.rollout.rollout_batch_size, cfg.rollout.n_samples_per_prompt) == (64, 8)
    assert cfg.rollout.rollout_max_context_len == 4096 and cfg.model.arch == "qwen3_vl"
    assert cfg.mini_batch_size == cfg.rollout.samples_per_step
    assert cfg.algo.advantage_estimator == "grpo" and not cfg.algo.use_kl
