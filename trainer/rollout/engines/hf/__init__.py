"""The HF engine: transformers generation in this process (`engine.HFEngine`), its batch loop, rows,
sampler, prompt preparation and loading, one module each."""

from vistarl.trainer.rollout.engines.hf.batch import EngineStats
from vistarl.trainer.rollout.engines.hf.engine import DEFAULT_MAX_BATCH_SIZE, HFEngine

__all__ = ["DEFAULT_MAX_BATCH_SIZE", "EngineStats", "HFEngine"]
