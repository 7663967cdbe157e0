"""The episode queue: `base` (interface, records), `redis` and `memory` (backends), `consumer` (the
trainer's side), `worker` (rollout workers), `episode_runner` (what a worker runs by default)."""

from __future__ import annotations

from typing import Any

from vistarl.trainer.queue.base import EpisodeQueue
from vistarl.trainer.queue.memory import MemoryQueue
from vistarl.trainer.queue.redis import RedisQueue

__all__ = ["open_queue"]


def open_queue(redis_url: str | None, namespace: str, **policy: Any) -> EpisodeQueue:
    """A `RedisQueue` at `redis_url`, or a `MemoryQueue` when it is None (single process).

    `policy` takes `lease_s`, `max_attempts`, `dedupe_ttl_s` and `dlq_maxlen`.
    """
    if redis_url is None:
        return MemoryQueue(namespace, **policy)
    return RedisQueue(redis_url, namespace, **policy)
