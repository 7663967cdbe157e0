"""The episode queue: jobs to rollout workers, trajectories back to the trainer, dead letters aside.

Two backends share one interface and one set of semantics (leases, reclaim, attempts, dead
letters, dedupe, staleness): `RedisQueue` on Redis Streams with consumer groups, for many workers
on many machines, and `MemoryQueue` inside one process. `open_queue` picks one. `docs/queue.md`
describes the design; the policy (retry or dead-letter, dedupe, staleness) lives in the shared
base class and `ResultConsumer`, the backends only store and move entries.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import re
import time
from abc import ABC, abstractmethod
from collections import OrderedDict, deque
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Concatenate, ParamSpec, TypeVar

import msgpack
import redis.asyncio as aioredis
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from typing_extensions import Self

__all__ = [
    "NAMESPACE_PATTERN",
    "TRAJECTORY_KEYS",
    "DeadLetter",
    "Delivery",
    "EpisodeJob",
    "EpisodeQueue",
    "MemoryQueue",
    "QueueFull",
    "QueueStats",
    "QueueUnavailable",
    "RedisQueue",
    "ResultConsumer",
    "StreamKeys",
    "entry_time",
    "open_queue",
    "pack",
    "pack_trajectory",
    "unpack",
]

P = ParamSpec("P")
T = TypeVar("T")

WORKERS_GROUP = "workers"
TRAINER_GROUP = "trainer"
TRAJECTORY_KEYS = ("episode_id", "group_id", "policy_version", "status", "error")
TRAJECTORY_STATUSES = ("COMPLETED", "TRUNCATED", "ABORTED", "FAILED")
MAX_ERROR_CHARS = 2000
NAMESPACE_PATTERN = r"^[A-Za-z0-9_.\-]+$"


class EpisodeJob(BaseModel):
    """One episode to run: which environment, how to start it, how to sample, and which attempt this is."""

    model_config = ConfigDict(extra="forbid")

    episode_id: str = Field(min_length=1)
    group_id: str = Field(min_length=1)
    env: str = Field(min_length=1, description="registered env name, import path, or http(s) URL")
    seed: int | None = None
    options: dict[str, Any] = Field(default_factory=dict)
    sample: dict[str, Any] | None = None
    sampling: dict[str, Any] = Field(default_factory=dict)
    policy_version: int = Field(default=0, ge=0)
    attempt: int = Field(default=1, ge=1)
    errors: list[str] = Field(default_factory=list, description="one line per failed attempt, oldest first")


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
    workers: int = Field(description="consumers active within the last three leases")


class QueueUnavailable(ConnectionError):
    """The queue's store cannot be reached right now; the operation may be retried."""


class QueueFull(TimeoutError):
    """`enqueue` ran out of time waiting for room under `max_in_flight`."""

    def __init__(self, enqueued: int, total: int, max_in_flight: int, timeout_s: float) -> None:
        super().__init__(
            f"enqueued {enqueued} of {total} jobs: still {max_in_flight} in flight after {timeout_s:g} s"
        )
        self.enqueued = enqueued


@dataclass(frozen=True)
class StreamKeys:
    """The Redis keys of one namespace; several runs can share one Redis under different namespaces."""

    jobs: str
    results: str
    dlq: str
    seen_prefix: str

    @classmethod
    def for_namespace(cls, namespace: str) -> StreamKeys:
        """Key names `vistarl:{namespace}:jobs|results|dlq|seen:<episode_id>`."""
        base = f"vistarl:{namespace}"
        return cls(f"{base}:jobs", f"{base}:results", f"{base}:dlq", f"{base}:seen:")


def pack(value: Any) -> bytes:
    """msgpack-encode a JSON-like value (the one wire format of every stream entry)."""
    return msgpack.packb(value, use_bin_type=True)


def unpack(payload: bytes) -> Any:
    """Decode what `pack` wrote."""
    return msgpack.unpackb(payload, raw=False)


def pack_trajectory(job: EpisodeJob, trajectory: Any) -> bytes:
    """Check a runner's trajectory against its job, stamp `attempt` on it, and msgpack-encode it."""
    if not isinstance(trajectory, dict):
        raise TypeError(f"an episode runner must return a dict, got {type(trajectory).__name__}")
    missing = [key for key in TRAJECTORY_KEYS if key not in trajectory]
    if missing:
        raise ValueError(f"trajectory lacks required keys {missing}")
    if trajectory["episode_id"] != job.episode_id:
        raise ValueError(f"trajectory episode_id {trajectory['episode_id']!r} != job's {job.episode_id!r}")
    if trajectory["status"] not in TRAJECTORY_STATUSES:
        raise ValueError(f"trajectory status {trajectory['status']!r} is not one of {TRAJECTORY_STATUSES}")
    trajectory["attempt"] = job.attempt
    try:
        return pack(trajectory)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"trajectory is not msgpack-serialisable: {exc}") from exc


def entry_time(entry_id: str) -> float:
    """The wall-clock time (seconds) a stream entry was added, read from its `<ms>-<seq>` id."""
    return int(entry_id.split("-", 1)[0]) / 1000.0


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else value


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
        """Renew the lease on `entry_ids`; return those still unacknowledged (the rest were lost)."""

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

    async def reclaim(self, consumer: str) -> int:
        """Take over jobs whose worker stopped heartbeating for a lease and fail them as "worker lost"."""
        stale = await self._claim_stale(consumer)
        for delivery in stale:
            await self.fail(delivery, f"worker lost: no heartbeat within the {self.lease_s:g} s lease")
        return len(stale)

    @abstractmethod
    async def forget_consumer(self, consumer: str) -> None:
        """Drop a departing worker's name from the group, if it holds no jobs."""

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
    async def _claim_stale(self, consumer: str) -> list[Delivery]:
        """Transfer to `consumer` the unacknowledged jobs idle for longer than the lease."""

    @abstractmethod
    async def _dead_page(self, after: str, count: int) -> list[DeadLetter]:
        """Up to `count` dead letters with ids after `after` ("" for the start)."""

    @abstractmethod
    async def _read_results(
        self, consumer: str, count: int, block_s: float, own_pending: bool
    ) -> list[tuple[str, bytes]]:
        """Deliver up to `count` results to `consumer` (its own unacknowledged ones if `own_pending`)."""

    @abstractmethod
    async def _settle_results(
        self, firsts: Sequence[tuple[str, str]], entry_ids: Sequence[str]
    ) -> list[bool]:
        """Mark each (episode_id, result entry id) as seen, then ack and delete `entry_ids`, atomically.

        Returns, per pair, True where this entry is the episode's first result (or is that same entry).
        """

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


class ResultConsumer:
    """The trainer's side: collect trajectories, each episode once, none older than `max_staleness` versions.

    Dedupe state lives in the queue's store (for Redis, one key per episode with a TTL), so a restarted
    consumer in the same run still drops duplicates. Set `policy_version` as the policy advances.
    """

    def __init__(
        self,
        queue: EpisodeQueue,
        *,
        max_staleness: int | None = None,
        policy_version: int = 0,
        name: str = "trainer",
    ) -> None:
        self.queue = queue
        self.max_staleness = max_staleness
        self.policy_version = policy_version
        self.name = name
        self.duplicates_dropped = 0
        self.stale_dropped = 0
        self.malformed_dropped = 0
        self._own_pending = True

    async def collect(self, n: int, timeout_s: float, max_batch: int = 512) -> list[dict[str, Any]]:
        """Wait up to `timeout_s` for `n` new, fresh trajectories; returns fewer if time runs out."""
        deadline = time.monotonic() + timeout_s
        collected: list[dict[str, Any]] = []
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

    def is_stale(self, trajectory: dict[str, Any]) -> bool:
        """True when the trajectory's policy is more than `max_staleness` versions behind."""
        version = trajectory.get("policy_version")
        if self.max_staleness is None or not isinstance(version, int):
            return False
        return self.policy_version - version > self.max_staleness

    async def _collect_batch(self, count: int, block_s: float) -> list[dict[str, Any]]:
        """Read one batch, acknowledge it, and keep the first and fresh trajectories."""
        entries = await self.queue._read_results(self.name, count, block_s, self._own_pending)
        if not entries:
            self._own_pending = False
            return []
        decoded = [(entry_id, _trajectory(payload)) for entry_id, payload in entries]
        valid = [(entry_id, traj) for entry_id, traj in decoded if traj is not None]
        self.malformed_dropped += len(decoded) - len(valid)
        firsts = await self.queue._settle_results(
            [(str(traj["episode_id"]), entry_id) for entry_id, traj in valid],
            [entry_id for entry_id, _ in entries],
        )
        kept = []
        for (_, trajectory), first in zip(valid, firsts, strict=True):
            if not first:
                self.duplicates_dropped += 1
            elif self.is_stale(trajectory):
                self.stale_dropped += 1
            else:
                kept.append(trajectory)
        return kept


def _trajectory(payload: bytes) -> dict[str, Any] | None:
    """Decode a results entry; None when it is not a trajectory (it is then dropped and counted)."""
    try:
        value = unpack(payload)
    except (ValueError, TypeError):
        return None
    return value if isinstance(value, dict) and "episode_id" in value else None


# --- Redis ------------------------------------------------------------------------------------

# Move one entry atomically, only if it is still there: from a group's pending list (ARGV[1] = group)
# or from a plain stream (ARGV[1] = ""), to the end of another stream, optionally capped (ARGV[5]).
_MOVE_SCRIPT = """
local removed
if ARGV[1] ~= '' then
  removed = redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
  if removed == 1 then redis.call('XDEL', KEYS[1], ARGV[2]) end
else
  removed = redis.call('XDEL', KEYS[1], ARGV[2])
end
if removed == 1 then
  if ARGV[5] ~= '' then
    redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[5], '*', ARGV[3], ARGV[4])
  else
    redis.call('XADD', KEYS[2], '*', ARGV[3], ARGV[4])
  end
end
return removed
"""

# Delete a consumer from a group only when it holds no pending entries (DELCONSUMER would drop them).
_FORGET_SCRIPT = """
if #redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2]) == 0 then
  redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
  return 1
end
return 0
"""

# Append ARGV[2..] as entries with field ARGV[1] to stream KEYS[1].
_ADD_SCRIPT = """
for i = 2, #ARGV do
  redis.call('XADD', KEYS[1], '*', ARGV[1], ARGV[i])
end
return #ARGV - 1
"""

# Publish ARGV[4..3+n] to results (KEYS[1], field ARGV[2]), then ack and delete jobs ARGV[4+n..] of
# group ARGV[1] in KEYS[2]: a job is acknowledged only together with its trajectory.
_PUBLISH_SCRIPT = """
local n = tonumber(ARGV[3])
for i = 4, 3 + n do
  redis.call('XADD', KEYS[1], '*', ARGV[2], ARGV[i])
end
for i = 4 + n, #ARGV, 1000 do
  local last = math.min(i + 999, #ARGV)
  redis.call('XACK', KEYS[2], ARGV[1], unpack(ARGV, i, last))
  redis.call('XDEL', KEYS[2], unpack(ARGV, i, last))
end
return n
"""

# Dedupe and consume results in one step. KEYS[2..1+n] are `seen` keys, ARGV[3+i] the result entry id
# for KEYS[1+i]; a key keeps the first entry id it was given (for ARGV[2] seconds). Then the entries
# ARGV[4+n..] of the results stream KEYS[1] are acked in group ARGV[1] and deleted.
_SETTLE_SCRIPT = """
local n = tonumber(ARGV[3])
local firsts = {}
for i = 1, n do
  local old = redis.call('SET', KEYS[1 + i], ARGV[3 + i], 'NX', 'GET', 'EX', ARGV[2])
  if (not old) or old == ARGV[3 + i] then firsts[i] = 1 else firsts[i] = 0 end
end
for i = 4 + n, #ARGV, 1000 do
  local last = math.min(i + 999, #ARGV)
  redis.call('XACK', KEYS[1], ARGV[1], unpack(ARGV, i, last))
  redis.call('XDEL', KEYS[1], unpack(ARGV, i, last))
end
return firsts
"""

_JOB_FIELD = b"j"
_RESULT_FIELD = b"t"
_DEAD_FIELD = b"d"
_MAX_BLOCK_S = 5.0
_ADD_BATCH = 1000  # jobs per enqueue script call, so one call never holds Redis for long


def _redis_call(
    method: Callable[Concatenate[RedisQueue, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[RedisQueue, P], Coroutine[Any, Any, T]]:
    """Create the groups on first use (again if Redis lost them); turn outages into `QueueUnavailable`."""

    @functools.wraps(method)
    async def call(self: RedisQueue, *args: P.args, **kwargs: P.kwargs) -> T:
        try:
            if not self._groups_ready:
                await self._ensure_groups()
            try:
                return await method(self, *args, **kwargs)
            except ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    raise
                await self._ensure_groups()
                return await method(self, *args, **kwargs)
        except (RedisConnectionError, RedisTimeoutError) as exc:
            raise QueueUnavailable(f"redis at {self._url_for_errors} is unavailable: {exc}") from exc

    return call


class RedisQueue(EpisodeQueue):
    """The queue on Redis Streams: a jobs stream with the `workers` group, a results stream with the
    `trainer` group, and a dead-letter stream. Acknowledged entries are deleted at once (XDEL), so the
    jobs stream holds exactly the pending and running jobs."""

    def __init__(
        self,
        url: str,
        namespace: str,
        *,
        retries: int = 8,
        backoff_cap_s: float = 1.0,
        socket_timeout_s: float = 10.0,
        **policy: Any,
    ) -> None:
        super().__init__(namespace, **policy)
        self._url_for_errors = url.rsplit("@", 1)[-1]
        self._redis = aioredis.Redis.from_url(
            url,
            decode_responses=False,
            retry=Retry(ExponentialBackoff(cap=backoff_cap_s, base=0.05), retries),
            retry_on_error=[RedisConnectionError, RedisTimeoutError],
            socket_timeout=socket_timeout_s,
            socket_connect_timeout=min(socket_timeout_s, 2.0),
        )
        self._move = self._redis.register_script(_MOVE_SCRIPT)
        self._forget = self._redis.register_script(_FORGET_SCRIPT)
        self._add_script = self._redis.register_script(_ADD_SCRIPT)
        self._publish = self._redis.register_script(_PUBLISH_SCRIPT)
        self._settle = self._redis.register_script(_SETTLE_SCRIPT)
        self._groups_ready = False

    async def _ensure_groups(self) -> None:
        """Create both consumer groups (and streams) if missing, from id 0 so no queued entry is skipped."""
        for stream, group in ((self.keys.jobs, WORKERS_GROUP), (self.keys.results, TRAINER_GROUP)):
            try:
                await self._redis.xgroup_create(stream, group, id="0", mkstream=True)
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
        self._groups_ready = True

    @_redis_call
    async def take(self, consumer: str, count: int, block_s: float) -> list[Delivery]:
        block_ms = int(min(block_s, _MAX_BLOCK_S) * 1000)
        reply = await self._redis.xreadgroup(
            WORKERS_GROUP, consumer, {self.keys.jobs: ">"}, count=count, block=block_ms or None
        )
        return await self._deliveries(self._entries(reply, _JOB_FIELD))

    @_redis_call
    async def heartbeat(self, consumer: str, entry_ids: Sequence[str]) -> set[str]:
        if not entry_ids:
            return set()
        claimed = await self._redis.xclaim(
            self.keys.jobs, WORKERS_GROUP, consumer, 0, list(entry_ids), justid=True
        )
        return {_text(entry_id) for entry_id in claimed}

    @_redis_call
    async def complete(self, done: Sequence[tuple[Delivery, bytes]]) -> None:
        if not done:
            return
        args: list[bytes | str | int] = [WORKERS_GROUP, _RESULT_FIELD, len(done)]
        args += [payload for _, payload in done]
        args += [delivery.entry_id for delivery, _ in done]
        await self._publish(keys=[self.keys.results, self.keys.jobs], args=args)

    @_redis_call
    async def forget_consumer(self, consumer: str) -> None:
        await self._forget(keys=[self.keys.jobs], args=[WORKERS_GROUP, consumer])

    @_redis_call
    async def stats(self) -> QueueStats:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.xlen(self.keys.jobs)
            pipe.xpending(self.keys.jobs, WORKERS_GROUP)
            pipe.xlen(self.keys.dlq)
            pipe.xlen(self.keys.results)
            pipe.xinfo_groups(self.keys.jobs)
            pipe.xinfo_consumers(self.keys.jobs, WORKERS_GROUP)
            jobs, pending, dead, results, groups, consumers = await pipe.execute()
        last_delivered = next(
            (_text(g["last-delivered-id"]) for g in groups if _text(g["name"]) == WORKERS_GROUP), "0-0"
        )
        oldest: Any = await self._redis.xrange(self.keys.jobs, min=f"({last_delivered}", count=1)
        active_ms = 3 * self.lease_s * 1000
        return QueueStats(
            namespace=self.namespace,
            pending=jobs - pending["pending"],
            in_flight=pending["pending"],
            dead=dead,
            results=results,
            lag_s=max(0.0, time.time() - entry_time(_text(oldest[0][0]))) if oldest else 0.0,
            workers=sum(1 for c in consumers if c["idle"] < active_ms),
        )

    async def close(self) -> None:
        await self._redis.aclose()

    @_redis_call
    async def _add(self, payloads: Sequence[bytes]) -> None:
        for start in range(0, len(payloads), _ADD_BATCH):
            await self._add_script(
                keys=[self.keys.jobs], args=[_JOB_FIELD, *payloads[start : start + _ADD_BATCH]]
            )

    @_redis_call
    async def _in_flight(self) -> int:
        return int(await self._redis.xlen(self.keys.jobs))

    @_redis_call
    async def _requeue(self, entry_id: str, job: EpisodeJob) -> bool:
        return await self._move_entry(
            self.keys.jobs, WORKERS_GROUP, entry_id, self.keys.jobs, _JOB_FIELD, job
        )

    @_redis_call
    async def _bury(self, entry_id: str, letter: DeadLetter) -> bool:
        return await self._move_entry(
            self.keys.jobs, WORKERS_GROUP, entry_id, self.keys.dlq, _DEAD_FIELD, letter
        )

    @_redis_call
    async def _unbury(self, dead_id: str, job: EpisodeJob) -> bool:
        return await self._move_entry(self.keys.dlq, "", dead_id, self.keys.jobs, _JOB_FIELD, job)

    async def _move_entry(
        self, source: str, group: str, entry_id: str, target: str, field: bytes, value: BaseModel
    ) -> bool:
        """Atomically: `entry_id` leaves `source` (acked in `group`, if any) and `value` joins `target`."""
        payload = pack(value.model_dump(exclude={"id"} if isinstance(value, DeadLetter) else None))
        maxlen = self.dlq_maxlen if target == self.keys.dlq else ""
        args: list[bytes | str | int] = [group, entry_id, field, payload, maxlen]
        return bool(await self._move(keys=[source, target], args=args))

    @_redis_call
    async def _claim_stale(self, consumer: str) -> list[Delivery]:
        entries: list[tuple[str, bytes]] = []
        cursor: bytes | str = "0-0"
        for _ in range(10):
            cursor, claimed, *_ = await self._redis.xautoclaim(
                self.keys.jobs, WORKERS_GROUP, consumer, int(self.lease_s * 1000), cursor, count=100
            )
            entries += [(_text(i), fields[_JOB_FIELD]) for i, fields in claimed if fields]
            if _text(cursor) == "0-0":
                break
        return await self._deliveries(entries)

    @_redis_call
    async def _dead_page(self, after: str, count: int) -> list[DeadLetter]:
        rows: Any = await self._redis.xrange(self.keys.dlq, min=f"({after}" if after else "-", count=count)
        return [DeadLetter(id=_text(i), **unpack(fields[_DEAD_FIELD])) for i, fields in rows]

    @_redis_call
    async def _read_results(
        self, consumer: str, count: int, block_s: float, own_pending: bool
    ) -> list[tuple[str, bytes]]:
        block_ms = None if own_pending else int(min(block_s, _MAX_BLOCK_S) * 1000) or None
        reply = await self._redis.xreadgroup(
            TRAINER_GROUP,
            consumer,
            {self.keys.results: "0" if own_pending else ">"},
            count=count,
            block=block_ms,
        )
        return self._entries(reply, _RESULT_FIELD)

    @_redis_call
    async def _settle_results(
        self, firsts: Sequence[tuple[str, str]], entry_ids: Sequence[str]
    ) -> list[bool]:
        keys = [self.keys.results, *(self.keys.seen_prefix + episode_id for episode_id, _ in firsts)]
        args: list[bytes | str | int] = [TRAINER_GROUP, int(self.dedupe_ttl_s), len(firsts)]
        args += [entry_id for _, entry_id in firsts]
        args += list(entry_ids)
        return [bool(first) for first in await self._settle(keys=keys, args=args)]

    @staticmethod
    def _entries(reply: Any, field: bytes) -> list[tuple[str, bytes]]:
        """Flatten an XREADGROUP reply of one stream to (entry id, payload); deleted entries read as b""."""
        if not reply:
            return []
        (_, rows), *_ = reply
        return [(_text(entry_id), fields.get(field, b"")) for entry_id, fields in rows]


# --- in process -------------------------------------------------------------------------------


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
        self._consumers: dict[str, float] = {}

    async def take(self, consumer: str, count: int, block_s: float) -> list[Delivery]:
        self._consumers[consumer] = time.monotonic()
        if not self._jobs.undelivered:
            await self._jobs.wait(block_s)
        return await self._deliveries(self._jobs.deliver(consumer, count))

    async def heartbeat(self, consumer: str, entry_ids: Sequence[str]) -> set[str]:
        now = time.monotonic()
        self._consumers[consumer] = now
        kept = {entry_id for entry_id in entry_ids if entry_id in self._jobs.leases}
        for entry_id in kept:
            self._jobs.leases[entry_id] = _Lease(consumer, now)
        return kept

    async def complete(self, done: Sequence[tuple[Delivery, bytes]]) -> None:
        for delivery, payload in done:
            self._results.add(payload)
            self._jobs.ack(delivery.entry_id)

    async def forget_consumer(self, consumer: str) -> None:
        if all(lease.consumer != consumer for lease in self._jobs.leases.values()):
            self._consumers.pop(consumer, None)

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
            workers=sum(1 for seen in self._consumers.values() if now - seen < 3 * self.lease_s),
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

    async def _claim_stale(self, consumer: str) -> list[Delivery]:
        now = time.monotonic()
        stale = [
            entry_id for entry_id, lease in self._jobs.leases.items() if now - lease.since >= self.lease_s
        ]
        for entry_id in stale:
            self._jobs.leases[entry_id] = _Lease(consumer, now)
        self._consumers[consumer] = now
        return await self._deliveries([(entry_id, self._jobs.entries[entry_id]) for entry_id in stale])

    async def _dead_page(self, after: str, count: int) -> list[DeadLetter]:
        floor = _EntryIds.order(after) if after else (-1, -1)
        ids = [i for i in self._dead if _EntryIds.order(i) > floor][:count]
        return [DeadLetter(id=i, **unpack(self._dead[i])) for i in ids]

    async def _read_results(
        self, consumer: str, count: int, block_s: float, own_pending: bool
    ) -> list[tuple[str, bytes]]:
        if own_pending:
            mine = [i for i, lease in self._results.leases.items() if lease.consumer == consumer][:count]
            return [(i, self._results.entries[i]) for i in mine]
        if not self._results.undelivered:
            await self._results.wait(block_s)
        return self._results.deliver(consumer, count)

    async def _settle_results(
        self, firsts: Sequence[tuple[str, str]], entry_ids: Sequence[str]
    ) -> list[bool]:
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


def open_queue(redis_url: str | None, namespace: str, **policy: Any) -> EpisodeQueue:
    """A `RedisQueue` at `redis_url`, or a `MemoryQueue` when it is None (single process).

    `policy` takes `lease_s`, `max_attempts`, `dedupe_ttl_s` and `dlq_maxlen`.
    """
    if redis_url is None:
        return MemoryQueue(namespace, **policy)
    return RedisQueue(redis_url, namespace, **policy)
