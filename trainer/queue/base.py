"""The episode queue's interface and records: jobs to rollout workers, trajectories back, dead letters aside.

Two backends share one interface and one set of semantics (leases, reclaim, attempts, dead letters,
dedupe): `RedisQueue` (`redis.py`) on Redis Streams with consumer groups, for many workers on many
machines, and `MemoryQueue` (`memory.py`) inside one process; `open_queue` picks one. The retry
policy (retry or dead-letter) lives here, dedupe in `ResultConsumer` (`consumer.py`); the backends
only store and move entries. `docs/queue.md` describes the design.
"""

from __future__ import annotations

import asyncio
import re
import time
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
from pydantic import BaseModel, Field, ValidationError
from typing_extensions import Self

from vistarl.trainer.rollout.job import EpisodeJob

__all__ = [
    "MAX_ERROR_CHARS",
    "NAMESPACE_PATTERN",
    "DeadLetter",
    "Delivery",
    "EpisodeQueue",
    "QueueFull",
    "QueueStats",
    "QueueUnavailable",
    "StreamKeys",
    "entry_time",
    "pack",
    "unpack",
]

MAX_ERROR_CHARS = 2000
NAMESPACE_PATTERN = r"^[A-Za-z0-9_.\-]+$"


@dataclass(frozen=True)
class Delivery:
    """A job handed to one worker: the stream entry that holds it and the decoded job."""

    entry_id: str
    job: EpisodeJob


class DeadLetter(BaseModel):
    """A job that used up its attempts (or could not be decoded), with its last error."""

    id: str = ""
    episode_id: str | None
    attempts: int
    error: str
    job: dict[str, Any]
    failed_at: float


class QueueStats(BaseModel):
    """A snapshot of one namespace: where its jobs and results are."""

    namespace: str
    pending: int = Field(description="enqueued, not yet delivered to a worker")
    in_flight: int = Field(description="delivered to a worker, not yet acknowledged")
    dead: int = Field(description="in the dead-letter stream")
    results: int = Field(description="published trajectories the trainer has not consumed yet")
    lag_s: float = Field(description="age of the oldest undelivered job; 0 when none waits")
    workers: int = Field(description="workers alive now: each heartbeats within its lease")


@dataclass(frozen=True)
class StreamKeys:
    """The Redis keys of one namespace; several runs can share one Redis under different namespaces."""

    jobs: str
    results: str
    dlq: str
    workers: str
    seen_prefix: str

    @classmethod
    def for_namespace(cls, namespace: str) -> StreamKeys:
        """Key names `vistarl:{namespace}:jobs|results|dlq|workers|seen:<episode_id>`."""
        base = f"vistarl:{namespace}"
        return cls(f"{base}:jobs", f"{base}:results", f"{base}:dlq", f"{base}:workers", f"{base}:seen:")


class QueueUnavailable(ConnectionError):
    """The queue's store cannot be reached right now; the operation may be retried."""


class QueueFull(TimeoutError):
    """`enqueue` ran out of time waiting for room under `max_in_flight`."""

    def __init__(self, enqueued: int, total: int, max_in_flight: int, timeout_s: float) -> None:
        super().__init__(
            f"enqueued {enqueued} of {total} jobs: still {max_in_flight} in flight after {timeout_s:g} s"
        )
        self.enqueued = enqueued


def pack(value: Any) -> bytes:
    """msgpack-encode a JSON-like value (the one wire format of every stream entry)."""
    return msgpack.packb(value, use_bin_type=True)


def unpack(payload: bytes) -> Any:
    """Decode what `pack` wrote."""
    return msgpack.unpackb(payload, raw=False)


def entry_time(entry_id: str) -> float:
    """The wall-clock time (seconds) a stream entry was added, read from its `<ms>-<seq>` id."""
    return int(entry_id.split("-", 1)[0]) / 1000.0


class EpisodeQueue(ABC):
    """The queue interface: producers enqueue, workers take/heartbeat/complete/fail, operators inspect.

    The retry policy is here: a failed attempt is re-enqueued as a fresh entry with `attempt + 1`
    and its error appended, until `max_attempts`, after which it goes to the dead-letter stream.
    Every move is conditional on the entry still being unacknowledged, so two workers racing to
    fail or reclaim the same entry move it once.
    """

    def __init__(
        self,
        namespace: str,
        *,
        lease_s: float = 30.0,
        max_attempts: int = 3,
        dedupe_ttl_s: float = 3 * 24 * 3600.0,
        dlq_maxlen: int = 100_000,
    ) -> None:
        if not re.match(NAMESPACE_PATTERN, namespace):
            raise ValueError(f"namespace {namespace!r} must match {NAMESPACE_PATTERN}")
        if lease_s <= 0 or max_attempts < 1 or dedupe_ttl_s <= 0 or dlq_maxlen < 1:
            raise ValueError("lease_s and dedupe_ttl_s must be > 0, max_attempts and dlq_maxlen >= 1")
        self.namespace = namespace
        self.keys = StreamKeys.for_namespace(namespace)
        self.lease_s = lease_s
        self.max_attempts = max_attempts
        self.dedupe_ttl_s = dedupe_ttl_s
        self.dlq_maxlen = dlq_maxlen

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- producers -----------------------------------------------------------------------------

    async def enqueue(
        self, jobs: Sequence[EpisodeJob], *, max_in_flight: int | None = None, timeout_s: float = 60.0
    ) -> int:
        """Add jobs in order; with `max_in_flight`, wait (up to `timeout_s`) while that many are queued."""
        payloads = [pack(job.model_dump()) for job in jobs]
        if max_in_flight is None:
            await self._add(payloads)
            return len(payloads)
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be >= 1")
        deadline = time.monotonic() + timeout_s
        sent, delay = 0, 0.01
        while sent < len(payloads):
            room = max_in_flight - await self._in_flight()
            if room > 0:
                await self._add(payloads[sent : sent + room])
                sent, delay = min(len(payloads), sent + room), 0.01
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                raise QueueFull(sent, len(payloads), max_in_flight, timeout_s)
            await asyncio.sleep(min(delay, left))
            delay = min(delay * 2, 0.5)
        return sent

    # --- workers -------------------------------------------------------------------------------

    @abstractmethod
    async def take(self, consumer: str, count: int, block_s: float) -> list[Delivery]:
        """Deliver up to `count` new jobs to `consumer`, waiting at most `block_s` for the first."""

    @abstractmethod
    async def heartbeat(self, consumer: str, entry_ids: Sequence[str]) -> set[str]:
        """Mark `consumer` alive for a lease and renew the lease on `entry_ids`; return those still
        unacknowledged (the rest were lost). Workers call it every `lease_s / 3`, idle or not."""

    @abstractmethod
    async def complete(self, done: Sequence[tuple[Delivery, bytes]]) -> None:
        """Publish packed trajectories and acknowledge their jobs, atomically as one batch."""

    async def fail(self, delivery: Delivery, error: str) -> bool:
        """Record a failed attempt: retry it as `attempt + 1`, or dead-letter it; True if dead-lettered."""
        job = delivery.job
        error = error[:MAX_ERROR_CHARS]
        errors = [*job.errors, f"attempt {job.attempt}: {error}"]
        if job.attempt < self.max_attempts:
            await self._requeue(
                delivery.entry_id, job.model_copy(update={"attempt": job.attempt + 1, "errors": errors})
            )
            return False
        letter = DeadLetter(
            episode_id=job.episode_id,
            attempts=job.attempt,
            error=error,
            job=job.model_copy(update={"errors": errors}).model_dump(),
            failed_at=time.time(),
        )
        await self._bury(delivery.entry_id, letter)
        return True

    async def release(self, deliveries: Sequence[Delivery]) -> None:
        """Hand unfinished jobs back for any worker to take at once, without counting an attempt."""
        for delivery in deliveries:
            await self._requeue(delivery.entry_id, delivery.job)

    async def reclaim(self, consumer: str) -> dict[str, int]:
        """Take over jobs whose worker stopped heartbeating for a lease and fail them as "worker lost";
        returns how many were taken from each lost worker."""
        taken: Counter[str] = Counter()
        for delivery, owner in await self._claim_stale(consumer):
            error = f"worker lost: {owner} sent no heartbeat within the {self.lease_s:g} s lease"
            await self.fail(delivery, error)
            taken[owner] += 1
        return dict(taken)

    @abstractmethod
    async def forget_consumer(self, consumer: str) -> None:
        """A departing worker: no longer alive, and its name leaves the group if it holds no jobs."""

    # --- the trainer (`ResultConsumer`) ----------------------------------------------------------

    @abstractmethod
    async def read_results(
        self, consumer: str, count: int, block_s: float, *, own_pending: bool
    ) -> list[tuple[str, bytes]]:
        """Deliver up to `count` published results to `consumer` as (entry id, packed trajectory),
        waiting at most `block_s` for the first. With `own_pending`, instead re-deliver at once the ones
        `consumer` read before and never settled (after a restart or an outage). Payloads are not
        checked here: the caller decodes and validates them."""

    @abstractmethod
    async def settle_results(self, firsts: Sequence[tuple[str, str]], entry_ids: Sequence[str]) -> list[bool]:
        """Mark each (episode id, result entry id) as seen, then acknowledge and delete `entry_ids`,
        atomically. Returns, per pair, True where this entry is the episode's first result (or is that
        same entry, settled again), so each episode is passed on once for `dedupe_ttl_s`."""

    # --- operators -----------------------------------------------------------------------------

    @abstractmethod
    async def stats(self) -> QueueStats:
        """Counts of pending, in-flight, dead and unconsumed entries, and the queue lag."""

    async def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        """The oldest `limit` dead letters."""
        return await self._dead_page("", limit)

    async def requeue_dead(self, ids: Sequence[str] | None = None) -> list[str]:
        """Move dead letters (all, or those `ids`) back to the jobs as attempt 1; return the moved ids."""
        wanted = None if ids is None else set(ids)
        moved: list[str] = []
        cursor = ""
        while page := await self._dead_page(cursor, 500):
            cursor = page[-1].id
            for letter in page:
                if wanted is not None and letter.id not in wanted:
                    continue
                try:
                    job = EpisodeJob.model_validate({**letter.job, "attempt": 1, "errors": []})
                except ValidationError:
                    continue
                if await self._unbury(letter.id, job):
                    moved.append(letter.id)
        return moved

    @abstractmethod
    async def close(self) -> None:
        """Release connections."""

    # --- storage primitives each backend implements -----------------------------------------------

    @abstractmethod
    async def _add(self, payloads: Sequence[bytes]) -> None:
        """Append packed jobs to the jobs stream."""

    @abstractmethod
    async def _in_flight(self) -> int:
        """Jobs enqueued and not yet acknowledged (pending plus running)."""

    @abstractmethod
    async def _requeue(self, entry_id: str, job: EpisodeJob) -> bool:
        """If `entry_id` is unacknowledged: ack and delete it and append `job` as a new entry."""

    @abstractmethod
    async def _bury(self, entry_id: str, letter: DeadLetter) -> bool:
        """If `entry_id` is unacknowledged: ack and delete it and append `letter` to the dead letters."""

    @abstractmethod
    async def _unbury(self, dead_id: str, job: EpisodeJob) -> bool:
        """If dead letter `dead_id` exists: delete it and append `job` to the jobs stream."""

    @abstractmethod
    async def _claim_stale(self, consumer: str) -> list[tuple[Delivery, str]]:
        """Transfer to `consumer` the unacknowledged jobs idle for longer than the lease, each with the
        consumer that held it."""

    @abstractmethod
    async def _dead_page(self, after: str, count: int) -> list[DeadLetter]:
        """Up to `count` dead letters with ids after `after` ("" for the start)."""

    # --- shared helpers --------------------------------------------------------------------------

    async def _deliveries(self, entries: Sequence[tuple[str, bytes]]) -> list[Delivery]:
        """Decode delivered entries; a malformed job goes straight to the dead letters, nothing is dropped."""
        deliveries = []
        for entry_id, payload in entries:
            raw: Any = None
            try:
                raw = unpack(payload)
                deliveries.append(Delivery(entry_id, EpisodeJob.model_validate(raw)))
            except (ValueError, TypeError) as exc:
                job = raw if isinstance(raw, dict) else {"raw": payload.hex()}
                letter = DeadLetter(
                    episode_id=str(job.get("episode_id")) if "episode_id" in job else None,
                    attempts=0,
                    error=f"malformed job: {exc}"[:MAX_ERROR_CHARS],
                    job=job,
                    failed_at=time.time(),
                )
                await self._bury(entry_id, letter)
        return deliveries
