"""`MemoryQueue`: the episode queue inside one process (one event loop), for the single-machine default.

The same interface and semantics as `RedisQueue` (leases, reclaim, attempts, dead letters, dedupe), on
in-memory streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from vistarl.trainer.queue.base import (
    DeadLetter,
    Delivery,
    EpisodeQueue,
    QueueStats,
    entry_time,
    pack,
    unpack,
)
from vistarl.trainer.rollout.job import EpisodeJob

__all__ = ["MemoryQueue"]


class _EntryIds:
    """Stream-style ids `<ms>-<seq>` that never go backwards, so they order like Redis stream ids."""

    def __init__(self) -> None:
        self._sequence = itertools.count()
        self._last_ms = 0

    def __call__(self) -> str:
        self._last_ms = max(self._last_ms, int(time.time() * 1000))
        return f"{self._last_ms}-{next(self._sequence)}"

    @staticmethod
    def order(entry_id: str) -> tuple[int, int]:
        ms, seq = entry_id.split("-", 1)
        return int(ms), int(seq)


@dataclass
class _Lease:
    consumer: str
    since: float


class _Stream:
    """An in-memory stream with one consumer group: entries in order, the undelivered ones, and leases."""

    def __init__(self, ids: Callable[[], str]) -> None:
        self._next_id = ids
        self.entries: dict[str, bytes] = {}
        self.undelivered: deque[str] = deque()
        self.leases: dict[str, _Lease] = {}
        self.added = asyncio.Event()

    def add(self, payload: bytes) -> str:
        entry_id = self._next_id()
        self.entries[entry_id] = payload
        self.undelivered.append(entry_id)
        self.added.set()
        return entry_id

    def deliver(self, consumer: str, count: int) -> list[tuple[str, bytes]]:
        now = time.monotonic()
        taken: list[tuple[str, bytes]] = []
        while self.undelivered and len(taken) < count:
            entry_id = self.undelivered.popleft()
            self.leases[entry_id] = _Lease(consumer, now)
            taken.append((entry_id, self.entries[entry_id]))
        return taken

    async def wait(self, block_s: float) -> None:
        """Return when an entry is added, or after `block_s`."""
        self.added.clear()
        if block_s > 0:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.added.wait(), block_s)

    def ack(self, entry_id: str) -> bool:
        if self.leases.pop(entry_id, None) is None:
            return False
        del self.entries[entry_id]
        return True


class MemoryQueue(EpisodeQueue):
    """The same queue inside one process (one event loop), for the single-machine default and fast tests."""

    def __init__(self, namespace: str = "default", **policy: Any) -> None:
        super().__init__(namespace, **policy)
        self._next_id = _EntryIds()
        self._jobs = _Stream(self._next_id)
        self._results = _Stream(self._next_id)
        self._dead: dict[str, bytes] = {}
        self._seen: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self._alive: dict[str, float] = {}  # consumer -> when its last heartbeat's lease runs out

    async def take(self, consumer: str, count: int, block_s: float) -> list[Delivery]:
        if not self._jobs.undelivered:
            await self._jobs.wait(block_s)
        return await self._deliveries(self._jobs.deliver(consumer, count))

    async def heartbeat(self, consumer: str, entry_ids: Sequence[str]) -> set[str]:
        now = time.monotonic()
        self._alive[consumer] = now + self.lease_s
        kept = {entry_id for entry_id in entry_ids if entry_id in self._jobs.leases}
        for entry_id in kept:
            self._jobs.leases[entry_id] = _Lease(consumer, now)
        return kept

    async def complete(self, done: Sequence[tuple[Delivery, bytes]]) -> None:
        for delivery, payload in done:
            self._results.add(payload)
            self._jobs.ack(delivery.entry_id)

    async def forget_consumer(self, consumer: str) -> None:
        self._alive.pop(consumer, None)

    async def stats(self) -> QueueStats:
        now = time.monotonic()
        oldest = self._jobs.undelivered[0] if self._jobs.undelivered else None
        return QueueStats(
            namespace=self.namespace,
            pending=len(self._jobs.undelivered),
            in_flight=len(self._jobs.leases),
            dead=len(self._dead),
            results=len(self._results.entries),
            lag_s=max(0.0, time.time() - entry_time(oldest)) if oldest else 0.0,
            workers=sum(1 for until in self._alive.values() if until > now),
        )

    async def close(self) -> None:
        return None

    async def _add(self, payloads: Sequence[bytes]) -> None:
        for payload in payloads:
            self._jobs.add(payload)

    async def _in_flight(self) -> int:
        return len(self._jobs.entries)

    async def _requeue(self, entry_id: str, job: EpisodeJob) -> bool:
        if not self._jobs.ack(entry_id):
            return False
        self._jobs.add(pack(job.model_dump()))
        return True

    async def _bury(self, entry_id: str, letter: DeadLetter) -> bool:
        if not self._jobs.ack(entry_id):
            return False
        self._dead[self._next_id()] = pack(letter.model_dump(exclude={"id"}))
        while len(self._dead) > self.dlq_maxlen:
            del self._dead[next(iter(self._dead))]
        return True

    async def _unbury(self, dead_id: str, job: EpisodeJob) -> bool:
        if self._dead.pop(dead_id, None) is None:
            return False
        self._jobs.add(pack(job.model_dump()))
        return True

    async def _claim_stale(self, consumer: str) -> list[tuple[Delivery, str]]:
        now = time.monotonic()
        owners = {
            entry_id: lease.consumer
            for entry_id, lease in self._jobs.leases.items()
            if now - lease.since >= self.lease_s
        }
        for entry_id in owners:
            self._jobs.leases[entry_id] = _Lease(consumer, now)
        deliveries = await self._deliveries([(entry_id, self._jobs.entries[entry_id]) for entry_id in owners])
        return [(delivery, owners[delivery.entry_id]) for delivery in deliveries]

    async def _dead_page(self, after: str, count: int) -> list[DeadLetter]:
        floor = _EntryIds.order(after) if after else (-1, -1)
        ids = [i for i in self._dead if _EntryIds.order(i) > floor][:count]
        return [DeadLetter(id=i, **unpack(self._dead[i])) for i in ids]

    async def read_results(
        self, consumer: str, count: int, block_s: float, *, own_pending: bool
    ) -> list[tuple[str, bytes]]:
        if own_pending:
            mine = [i for i, lease in self._results.leases.items() if lease.consumer == consumer][:count]
            return [(i, self._results.entries[i]) for i in mine]
        if not self._results.undelivered:
            await self._results.wait(block_s)
        return self._results.deliver(consumer, count)

    async def settle_results(self, firsts: Sequence[tuple[str, str]], entry_ids: Sequence[str]) -> list[bool]:
        now = time.monotonic()
        while self._seen and next(iter(self._seen.values()))[1] < now:
            self._seen.popitem(last=False)
        answers = []
        for episode_id, entry_id in firsts:
            owner = self._seen.setdefault(episode_id, (entry_id, now + self.dedupe_ttl_s))[0]
            answers.append(owner == entry_id)
        for entry_id in entry_ids:
            self._results.ack(entry_id)
        return answers
