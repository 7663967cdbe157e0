"""The HF engine's counters as a step reports them: what one step added, several engines together, and the
shares and means the trainer logs from them."""

from __future__ import annotations

import pytest

from vistarl.trainer.rollout.engines.hf.batch import EngineStats
from vistarl.trainer.run.rollout_metrics import engine_metrics


def test_a_step_reports_what_was_counted_since_the_last_one() -> None:
    before = EngineStats(batches=2, rows=10, largest_batch=6, prompt_passes=3, prompt_s=1.0, batch_s=4.0)
    now = EngineStats(batches=5, rows=30, largest_batch=8, prompt_passes=7, prompt_s=1.5, batch_s=9.0)
    step = now.since(before)
    assert (step.batches, step.rows, step.prompt_passes) == (3, 20, 4)
    assert (step.prompt_s, step.batch_s) == pytest.approx((0.5, 5.0))
    assert step.largest_batch == 8


def test_engines_count_together() -> None:
    a = EngineStats(rows=3, largest_batch=3, decode_steps=10, generated_tokens=33, batch_s=1.0)
    b = EngineStats(rows=5, largest_batch=5, decode_steps=20, generated_tokens=85, batch_s=2.0)
    total = EngineStats.total([a, b])
    assert (total.rows, total.decode_steps, total.generated_tokens, total.largest_batch) == (8, 30, 118, 5)
    assert total.batch_s == pytest.approx(3.0)
    assert EngineStats.total([]) == EngineStats()


def test_the_logged_figures_come_from_the_counters() -> None:
    stats = EngineStats(
        rows=4,
        prompt_passes=2,
        prompt_tokens=1000,
        cached_prompt_tokens=750,
        prompt_s=0.3,
        batch_s=1.3,
        decode_steps=50,
        generated_tokens=154,
    )
    metrics = engine_metrics(stats)
    assert metrics["engine/prompt_share"] == pytest.approx(0.3 / 1.3)
    assert metrics["engine/cached_share"] == pytest.approx(0.75)
    assert metrics["engine/decode_step_ms"] == pytest.approx(20.0)
    assert metrics["engine/rows_per_step"] == pytest.approx(3.0)
    idle = engine_metrics(EngineStats())
    assert idle == {"engine/prompt_passes": 0.0, "engine/decode_steps": 0.0}
