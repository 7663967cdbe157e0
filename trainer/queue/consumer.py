"""The trainer's side of the queue: `ResultConsumer` collects trajectories, each episode once.

A result entry is decoded and validated into a `Trajectory` here, at the boundary. An entry that is
not a valid trajectory is dropped and counted by its reason (`rejected`), never passed on. Dedupe state
lives in the queue's store (for Redis, one key per episode with a TTL), so a restarted consumer in the
same run still drops duplicates.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

from pydantic import ValidationError

from vistarl.trainer.queue.base import EpisodeQueue, QueueUnavailable
from vistarl.trainer.rollout.trajectory import Trajectory

__all__ = ["ResultConsumer"]


class ResultConsumer:
    """Collect trajectories from `queue`: each episode's first result once; invalid entries are counted."""

    def __init__(self, queue: EpisodeQueue, *, name: str = "trainer") -> None:
        self.queue = queue
        self.name = name
        self.duplicates_dropped = 0
        self.rejected: Counter[str] = Counter()
        self._own_pending = True

    async def collect(self, n: int, timeout_s: float, max_batch: int = 512) -> list[Trajectory]:
        """Wait up to `timeout_s` for `n` new trajectories; returns fewer if time runs out."""
        deadline = time.monotonic() + timeout_s
        collected: list[Trajectory] = []
        while len(collected) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                collected.extend(
                    await self._collect_batch(min(n - len(collected), max_batch), min(left, 1.0))
                )
            except QueueUnavailable:
                self._own_pending = True
                await asyncio.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
        return collected

    async def _collect_batch(self, count: int, block_s: float) -> list[Trajectory]:
        """Read one batch, acknowledge it, and keep the valid first result of each episode."""
        entries = await self.queue.read_results(self.name, count, block_s, own_pending=self._own_pending)
        if not entries:
            self._own_pending = False
            return []
        valid: list[tuple[str, Trajectory]] = []
        for entry_id, payload in entries:
            try:
                valid.append((entry_id, Trajectory.from_msgpack(payload)))
            except ValueError as exc:
                self.rejected[_reason(exc)] += 1
        firsts = await self.queue.settle_results(
            [(trajectory.episode_id, entry_id) for entry_id, trajectory in valid],
            [entry_id for entry_id, _ in entries],
        )
        self.duplicates_dropped += firsts.count(False)
        return [trajectory for (_, trajectory), first in zip(valid, firsts, strict=True) if first]


def _reason(error: ValueError) -> str:
    """A short label for why an entry is not a trajectory: its first invalid field, or the decoder."""
    if isinstance(error, ValidationError):
        first = error.errors()[0]
        location = ".".join(str(part) for part in first["loc"]) or "record"
        return f"{location}: {first['type']}"
    return "not msgpack"
