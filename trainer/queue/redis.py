"""`RedisQueue`: the episode queue on Redis Streams with consumer groups, for many workers on many machines.

A jobs stream with the `workers` group, a results stream with the `trainer` group, and a dead-letter
stream, per namespace. Every move between streams is one Lua script, commented with the race it closes.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Concatenate, ParamSpec, TypeVar

import redis.asyncio as aioredis
from pydantic import BaseModel
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from vistarl.trainer.queue.base import (
    DeadLetter,
    Delivery,
    EpisodeQueue,
    QueueStats,
    QueueUnavailable,
    entry_time,
    pack,
    unpack,
)
from vistarl.trainer.rollout.job import EpisodeJob

__all__ = ["RedisQueue"]

P = ParamSpec("P")
T = TypeVar("T")

WORKERS_GROUP = "workers"
TRAINER_GROUP = "trainer"

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

# A departing worker: drop it from the live workers (KEYS[2]) at once, and delete it from the group only
# when it holds no pending entries (DELCONSUMER would drop them).
_FORGET_SCRIPT = """
redis.call('ZREM', KEYS[2], ARGV[2])
if #redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2]) == 0 then
  redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
  return 1
end
return 0
"""

# The live workers, a sorted set KEYS[1] of consumer -> the time its lease runs out. The scores are in
# Redis's own clock (TIME), so the clocks of the workers' hosts do not matter; XINFO CONSUMERS cannot
# tell liveness (Redis 7.0 creates no consumer for a read that found nothing, and its `idle` ignores
# such reads). Drops the expired, then (if ARGV[1] is a consumer) renews ARGV[1] for ARGV[2] ms.
# Returns how many are alive.
_ALIVE_SCRIPT = """
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ms)
if ARGV[1] ~= '' then
  redis.call('ZADD', KEYS[1], ms + tonumber(ARGV[2]), ARGV[1])
end
return redis.call('ZCARD', KEYS[1])
"""

# Append ARGV[2..] as entries with field ARGV[1] to stream KEYS[1].
_ADD_SCRIPT = """
for i = 2, #ARGV do
  redis.call('XADD', KEYS[1], '*', ARGV[1], ARGV[i])
end
return #ARGV - 1
"""

# The tail of a script: ack in group ARGV[1] and delete the entries ARGV[first..] of `stream` (locals the
# script sets), 1000 ids per call: well within the values Lua's `unpack` can spread at once.
_ACK_AND_DELETE_REST = """
for i = first, #ARGV, 1000 do
  local last = math.min(i + 999, #ARGV)
  redis.call('XACK', stream, ARGV[1], unpack(ARGV, i, last))
  redis.call('XDEL', stream, unpack(ARGV, i, last))
end
"""

# Publish ARGV[4..3+n] to results (KEYS[1], field ARGV[2]), then ack and delete jobs ARGV[4+n..] of
# group ARGV[1] in KEYS[2]: a job is acknowledged only together with its trajectory.
_PUBLISH_SCRIPT = (
    """
local n = tonumber(ARGV[3])
for i = 4, 3 + n do
  redis.call('XADD', KEYS[1], '*', ARGV[2], ARGV[i])
end
local stream, first = KEYS[2], 4 + n
"""
    + _ACK_AND_DELETE_REST
    + "return n\n"
)

# Dedupe and consume results in one step. KEYS[2..1+n] are `seen` keys, ARGV[3+i] the result entry id
# for KEYS[1+i]; a key keeps the first entry id it was given (for ARGV[2] seconds). Then the entries
# ARGV[4+n..] of the results stream KEYS[1] are acked in group ARGV[1] and deleted.
_SETTLE_SCRIPT = (
    """
local n = tonumber(ARGV[3])
local firsts = {}
for i = 1, n do
  local old = redis.call('SET', KEYS[1 + i], ARGV[3 + i], 'NX', 'GET', 'EX', ARGV[2])
  if (not old) or old == ARGV[3 + i] then firsts[i] = 1 else firsts[i] = 0 end
end
local stream, first = KEYS[1], 4 + n
"""
    + _ACK_AND_DELETE_REST
    + "return firsts\n"
)

_JOB_FIELD = b"j"
_RESULT_FIELD = b"t"
_DEAD_FIELD = b"d"
_MAX_BLOCK_S = 5.0
_ADD_BATCH = 1000  # jobs per enqueue script call, so one call never holds Redis for long
_RECLAIM_BATCH = 1000  # stale jobs taken over per reclaim round; the next round takes the rest


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
        self._alive = self._redis.register_script(_ALIVE_SCRIPT)
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
        await self._alive(keys=[self.keys.workers], args=[consumer, int(self.lease_s * 1000)])
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
        await self._forget(keys=[self.keys.jobs, self.keys.workers], args=[WORKERS_GROUP, consumer])

    @_redis_call
    async def stats(self) -> QueueStats:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.xlen(self.keys.jobs)
            pipe.xpending(self.keys.jobs, WORKERS_GROUP)
            pipe.xlen(self.keys.dlq)
            pipe.xlen(self.keys.results)
            pipe.xinfo_groups(self.keys.jobs)
            jobs, pending, dead, results, groups = await pipe.execute()
        last_delivered = next(
            (_text(g["last-delivered-id"]) for g in groups if _text(g["name"]) == WORKERS_GROUP), "0-0"
        )
        oldest: Any = await self._redis.xrange(self.keys.jobs, min=f"({last_delivered}", count=1)
        alive = await self._alive(keys=[self.keys.workers], args=["", 0])
        return QueueStats(
            namespace=self.namespace,
            pending=jobs - pending["pending"],
            in_flight=pending["pending"],
            dead=dead,
            results=results,
            lag_s=max(0.0, time.time() - entry_time(_text(oldest[0][0]))) if oldest else 0.0,
            workers=alive,
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
    async def _claim_stale(self, consumer: str) -> list[tuple[Delivery, str]]:
        """XPENDING IDLE names the stale entries and their owners; XCLAIM with the same minimum idle
        time then takes only those still stale, so an owner's heartbeat in between keeps its job."""
        lease_ms = int(self.lease_s * 1000)
        stale: Any = await self._redis.xpending_range(
            self.keys.jobs, WORKERS_GROUP, "-", "+", _RECLAIM_BATCH, idle=lease_ms
        )
        if not stale:
            return []
        owners = {_text(row["message_id"]): _text(row["consumer"]) for row in stale}
        claimed: Any = await self._redis.xclaim(
            self.keys.jobs, WORKERS_GROUP, consumer, lease_ms, list(owners)
        )
        entries = [(_text(i), fields[_JOB_FIELD]) for i, fields in claimed if fields]
        return [(delivery, owners[delivery.entry_id]) for delivery in await self._deliveries(entries)]

    @_redis_call
    async def _dead_page(self, after: str, count: int) -> list[DeadLetter]:
        rows: Any = await self._redis.xrange(self.keys.dlq, min=f"({after}" if after else "-", count=count)
        return [DeadLetter(id=_text(i), **unpack(fields[_DEAD_FIELD])) for i, fields in rows]

    @_redis_call
    async def read_results(
        self, consumer: str, count: int, block_s: float, *, own_pending: bool
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
    async def settle_results(self, firsts: Sequence[tuple[str, str]], entry_ids: Sequence[str]) -> list[bool]:
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


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else value
