"""The HF engine: transformers generation in this process (`engine.HFEngine`), its batch loop, rows,
sampler, prompt preparation, prefix cache and loading, one module each."""

from vistarl.trainer.rollout.engines.hf.batch import EngineStats
from vistarl.trainer.rollout.engines.hf.engine import (
    DEFAULT_MAX_BATCH_SIZE,
    DEFAULT_PREFIX_CACHE_MB,
    HFEngine,
)

__all__ = ["DEFAULT_MAX_BATCH_SIZE", "DEFAULT_PREFIX_CACHE_MB", "EngineStats", "HFEngine"]
