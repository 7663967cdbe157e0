"""What a step's gathered episodes tell: the rollout metrics each step logs, and how its episodes ended."""

from __future__ import annotations

import math
from collections import Counter, defaultdict

import torch

from vistarl.trainer.rollout.engines.hf.batch import EngineStats
from vistarl.trainer.rollout.trajectory import Status
from vistarl.trainer.run.stack import Gathered, Stack

__all__ = ["endings", "engine_metrics", "left_out", "outcomes", "rollout_metrics", "throughput"]

ERRORS_SHOWN = 2
ERROR_CHARS = 200
"""A step's note shows at most this many distinct errors of each ending, each cut to this length."""

RENAMED = {
    "turns": "rollout/turns",
    "generated_tokens": "rollout/response_tokens",
    "context_tokens": "rollout/context_tokens",
}
"""Episode metrics logged under another name; `env/...` ones keep theirs, the rest are not logged."""


def rollout_metrics(gathered: Gathered, stack: Stack) -> dict[str, float]:
    """Reward and env metrics over usable episodes; statuses, lengths and losses over all of them; how the
    episodes of the step's earlier tries ended (`rollout/unusable/<STATUS, missing or stale>`), if it had
    any."""
    trajectories = gathered.trajectories
    usable = [t for t in trajectories if t.status.played]
    metrics: dict[str, float] = {
        "rollout/episodes": float(len(trajectories)),
        "rollout/missing": float(gathered.missing),
        "rollout/stale": float(gathered.stale),
        "rollout/unexpected": float(stack.unexpected),
        "rollout/rejected": float(stack.rejected),
        "rollout/duplicates": float(stack.duplicates),
        "rollout/unusable_tries": float(gathered.tries - 1),
    }
    for index, requests in enumerate(stack.engine_requests()):  # how a pool spread the step's generation
        metrics[f"rollout/engine_requests/{index}"] = float(requests)
    if (stats := stack.engine_stats()) is not None:
        metrics.update(engine_metrics(stats))
    statuses = Counter(t.status for t in trajectories)
    for status in Status:
        metrics[f"rollout/status/{status.value}"] = float(statuses.get(status, 0))
    for ending, count in gathered.unusable.items():
        metrics[f"rollout/unusable/{ending}"] = float(count)
    if trajectories:
        lags = [stack.lag(t) for t in trajectories]
        metrics["rollout/policy_lag"] = sum(lags) / len(lags)
    if usable:
        metrics.update(_usable_metrics(gathered))
    return {k: v for k, v in metrics.items() if math.isfinite(v)}


def engine_metrics(stats: EngineStats) -> dict[str, float]:
    """Where an in-process engine's time went over a step (`stats`: its counters over the step): the prompt
    passes' share of its batches' time, the prefix cache's share of the prompt tokens, and the mean decode
    step's milliseconds and live rows (the tokens the steps drew: all but each request's first)."""
    metrics = {
        "engine/prompt_passes": float(stats.prompt_passes),
        "engine/decode_steps": float(stats.decode_steps),
    }
    if stats.batch_s > 0:
        metrics["engine/prompt_share"] = stats.prompt_s / stats.batch_s
    if stats.prompt_tokens:
        metrics["engine/cached_share"] = stats.cached_prompt_tokens / stats.prompt_tokens
    if stats.decode_steps:
        metrics["engine/decode_step_ms"] = 1000 * (stats.batch_s - stats.prompt_s) / stats.decode_steps
        metrics["engine/rows_per_step"] = (stats.generated_tokens - stats.rows) / stats.decode_steps
    return metrics


def _usable_metrics(gathered: Gathered) -> dict[str, float]:
    """The reward's spread, the mean of each logged episode metric and each timing, over usable episodes."""
    usable = [t for t in gathered.trajectories if t.status.played]
    rewards = torch.tensor([t.episode_reward for t in usable])
    metrics = {
        "reward/mean": float(rewards.mean()),
        "reward/std": float(rewards.std()) if len(usable) > 1 else 0.0,
        "reward/min": float(rewards.min()),
        "reward/max": float(rewards.max()),
    }
    per_episode: defaultdict[str, list[float]] = defaultdict(list)
    for t in usable:
        for name, value in t.metrics.items():
            per_episode[name].append(value)
    for name, values in per_episode.items():
        if name.startswith("env/") or name in RENAMED:
            metrics[RENAMED.get(name, name)] = sum(values) / len(values)
    for part in sorted({part for t in usable for part in t.timings}):  # mean seconds per episode
        metrics[f"rollout/seconds/{part}"] = sum(t.timings.get(part, 0.0) for t in usable) / len(usable)
    return metrics


def throughput(gathered: Gathered, step_s: float) -> dict[str, float]:
    """Generated tokens and episodes per second of a step that took `step_s`."""
    generated = sum(t.metrics.get("generated_tokens", 0.0) for t in gathered.trajectories)
    return {
        "perf/tokens_per_s": generated / step_s,
        "perf/episodes_per_s": len(gathered.trajectories) / step_s,
    }


def endings(*batches: Gathered) -> Counter[str]:
    """How the episodes of `batches` ended: a count per status, and `missing` and `stale` (none at 0)."""
    counts: Counter[str] = Counter()
    for batch in batches:
        counts.update(t.status.value for t in batch.trajectories)
        counts.update(missing=batch.missing, stale=batch.stale)
    return +counts


def outcomes(gathered: Gathered) -> str:
    """How a step's episodes ended, e.g. `3 COMPLETED, 5 FAILED, 0 missing`."""
    counts = Counter(t.status.value for t in gathered.trajectories)
    ended = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    return f"{ended}, {gathered.missing} missing"


def left_out(gathered: Gathered) -> list[str]:
    """One line for each unplayed ending (FAILED, ABORTED) among a step's episodes, with its count and
    first errors: a step that trains on the rest still says why some were left out."""
    trajectories = gathered.trajectories
    lines = []
    for status in (Status.FAILED, Status.ABORTED):
        errors = Counter(t.error or "no error reported" for t in trajectories if t.status is status)
        if errors:
            shown = "; ".join(error[:ERROR_CHARS] for error, _ in errors.most_common(ERRORS_SHOWN))
            more = f" (and {len(errors) - ERRORS_SHOWN} other errors)" if len(errors) > ERRORS_SHOWN else ""
            lines.append(f"{errors.total()} of {len(trajectories)} episodes {status.value}: {shown}{more}")
    return lines
