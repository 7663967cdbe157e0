"""`RedisSessionStore`: sessions in Redis, shared by every replica of one env, so any replica serves any step.

Per session two keys, under one hash tag (so that a Redis Cluster keeps them in one slot):
- `vistarl:session:<env>:{<id>}`, a hash: `v` the version, `s` the env state (msgpack), `a` the last
  answer (the reset's or the last step's body), `d` set once done,
  `n` the nonce of the reset that created it, `c` that of the last commit, and `r:<request_id>` the answers
  kept for retries (msgpack `[digest, body]`);
- `...:{<id>}:ids`, a list of the kept answers' fields, oldest first, to forget beyond `answers_kept`.
Both expire by Redis TTL: `session_ttl_s` while live, `tombstone_ttl_s` once finished. Every change is one
Lua script, commented with the race it closes. An unreachable Redis is a 503 `store_unavailable`.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Sequence
from typing import TypeVar

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from vistarl.clients.protocol import ErrorCode
from vistarl.httpserver.errors import ServiceError
from vistarl.services.server.store.base import Commit, Retention, Snapshot, StepRecord, StoredAnswer

T = TypeVar("T")

TIMEOUT_S = 5.0  # bound on one Redis command, connecting included
RETRIES = 2  # resends after a connection error or timeout: every script below is safe to resend

# Create a session unless its id is taken: closes the race of two replicas resetting one client-chosen
# session_id at once (one creates it, the other gets 0). A resend after a lost reply finds its own
# nonce and answers 1 again instead of calling its own session taken.
# KEYS: session, ids. ARGV: state, nonce, ttl ms, answer.
_CREATE = """
if redis.call('EXISTS', KEYS[1]) == 1 then
  if redis.call('HGET', KEYS[1], 'n') == ARGV[2] then return 1 end
  return 0
end
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[1], 'v', 0, 's', ARGV[1], 'n', ARGV[2], 'a', ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"""

# Read a session before a step: its version, done, and the answer of the step's request_id, at one
# instant, so that the commit's version check proves that no step (a twin of this one included) landed
# since. A live session gets its TTL afresh; a tombstone does not, which a separate PEXPIRE could not
# promise (the session may finish between the read and the PEXPIRE).
# KEYS: session, ids. ARGV: answer field or '', ttl ms.
_SNAPSHOT = """
local v = redis.call('HGET', KEYS[1], 'v')
if not v then return false end
local done = redis.call('HGET', KEYS[1], 'd')
local answer = false
if ARGV[1] ~= '' then answer = redis.call('HGET', KEYS[1], ARGV[1]) end
if not done then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
end
return {v, done or '', answer or ''}
"""

# Store one step only if the session is still at the version the step started from. Closes the race of
# two replicas stepping one session at once (the later commit finds the version moved, 0, and its
# replica starts over from the stored state) and that of a step finishing after its session was
# deleted (-1: nothing is revived). A resend after a lost reply finds its own nonce: 1. Checked before
# the version, in the same instant: the step's request_id answered already (the stored answer, to
# replay: the step was a retry) and the episode over (-2). A finishing step turns the session into a
# tombstone: version, done, nonce and its own answer only.
# KEYS: session, ids. ARGV: version, nonce, state, done ('1' or ''), answer field or '', answer,
# answers kept, ttl ms, tombstone ttl ms, the answer's body (the session's last answer from now on).
_COMMIT = """
local v = redis.call('HGET', KEYS[1], 'v')
if not v then return -1 end
if redis.call('HGET', KEYS[1], 'c') == ARGV[2] then return 1 end
if ARGV[5] ~= '' then
  local answered = redis.call('HGET', KEYS[1], ARGV[5])
  if answered then return answered end
end
if redis.call('HEXISTS', KEYS[1], 'd') == 1 then return -2 end
if v ~= ARGV[1] then return 0 end
local next = tonumber(v) + 1
if ARGV[4] == '1' then
  redis.call('DEL', KEYS[1], KEYS[2])
  redis.call('HSET', KEYS[1], 'v', next, 'd', '1', 'c', ARGV[2], 'a', ARGV[10])
  if ARGV[5] ~= '' then redis.call('HSET', KEYS[1], ARGV[5], ARGV[6]) end
  redis.call('PEXPIRE', KEYS[1], ARGV[9])
  return 1
end
redis.call('HSET', KEYS[1], 'v', next, 's', ARGV[3], 'c', ARGV[2], 'a', ARGV[10])
if ARGV[5] ~= '' then
  redis.call('HSET', KEYS[1], ARGV[5], ARGV[6])
  redis.call('RPUSH', KEYS[2], ARGV[5])
  while redis.call('LLEN', KEYS[2]) > tonumber(ARGV[7]) do
    redis.call('HDEL', KEYS[1], redis.call('LPOP', KEYS[2]))
  end
  redis.call('PEXPIRE', KEYS[2], ARGV[8])
end
redis.call('PEXPIRE', KEYS[1], ARGV[8])
return 1
"""

_COMMITS = {1: Commit.STORED, 0: Commit.CONFLICT, -1: Commit.GONE, -2: Commit.DONE}


class RedisSessionStore:
    """A `SessionStore` in Redis, for the replicas of env `env_name` (docs/server.md, "Session store")."""

    shared = True

    def __init__(
        self,
        url: str,
        env_name: str,
        retention: Retention,
        retry_after_s: int,
    ) -> None:
        self.where = url.rsplit("@", 1)[-1]  # no password in messages
        self.ttl_ms = round(retention.ttl_s * 1000)
        self.tombstone_ttl_ms = round(retention.tombstone_ttl_s * 1000)
        self.answers_kept = retention.answers_kept
        self.retry_after = {"Retry-After": str(retry_after_s)}
        self.prefix = f"vistarl:session:{env_name}:"
        self._redis = aioredis.Redis.from_url(
            url,
            socket_timeout=TIMEOUT_S,
            socket_connect_timeout=TIMEOUT_S,
            retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), RETRIES),
        )
        self._create = self._redis.register_script(_CREATE)
        self._snapshot = self._redis.register_script(_SNAPSHOT)
        self._commit = self._redis.register_script(_COMMIT)

    async def open(self) -> None:
        try:
            await self._redis.ping()
        except RedisError as exc:
            raise RuntimeError(f"the session store at {self.where} cannot be reached: {exc}") from exc

    async def close(self) -> None:
        await self._redis.aclose()

    async def create(self, session_id: str, state: bytes | None, answer: bytes) -> bool:
        args: list[bytes | str | int] = [state or b"", uuid.uuid4().hex, self.ttl_ms, answer]
        return bool(await self._call(self._create(keys=self._keys(session_id), args=args)))

    async def snapshot(self, session_id: str, request_id: str | None) -> Snapshot | None:
        field = "" if request_id is None else _answer_field(request_id)
        found = await self._call(self._snapshot(keys=self._keys(session_id), args=[field, self.ttl_ms]))
        if found is None:
            return None
        version, done, answer = found
        return Snapshot(int(version), bool(done), StoredAnswer.unpack(answer) if answer else None)

    async def state(self, session_id: str) -> tuple[int, bytes] | None:
        version, state, done = await self._call(self._redis.hmget(self._keys(session_id)[0], ["v", "s", "d"]))
        if version is None or not isinstance(state, bytes) or done is not None:
            return None
        return int(version), state

    async def commit(self, session_id: str, version: int, record: StepRecord) -> Commit | StoredAnswer:
        field = "" if record.request_id is None else _answer_field(record.request_id)
        args: list[bytes | str | int] = [
            version,
            uuid.uuid4().hex,
            record.state or b"",
            "1" if record.done else "",
            field,
            record.answer.pack(),
            self.answers_kept,
            self.ttl_ms,
            self.tombstone_ttl_ms,
            record.answer.body,
        ]
        reply = await self._call(self._commit(keys=self._keys(session_id), args=args))
        return StoredAnswer.unpack(reply) if isinstance(reply, bytes) else _COMMITS[int(reply)]

    async def last_answer(self, session_id: str) -> bytes | None:
        answer = await self._call(self._redis.hget(self._keys(session_id)[0], "a"))
        return answer if isinstance(answer, bytes) else None

    async def delete(self, session_id: str) -> bool:
        return bool(await self._call(self._redis.delete(*self._keys(session_id))))

    async def versions(self, session_ids: Sequence[str]) -> list[int | None]:
        pipe = self._redis.pipeline(transaction=False)
        for session_id in session_ids:
            pipe.hget(self._keys(session_id)[0], "v")
        found = await self._call(pipe.execute())
        return [None if version is None else int(version) for version in found]

    async def _call(self, pending: Awaitable[T]) -> T:
        """Await one Redis call; an outage (no connection, a timeout, Redis out of memory) becomes a 503
        `store_unavailable`."""
        try:
            return await pending
        except (RedisConnectionError, RedisTimeoutError, ResponseError) as exc:
            if isinstance(exc, ResponseError) and not str(exc).startswith("OOM"):
                raise
            raise ServiceError(
                ErrorCode.STORE_UNAVAILABLE,
                f"the session store at {self.where} is unavailable: {exc}",
                self.retry_after,
            ) from exc

    def _keys(self, session_id: str) -> list[str]:
        """The session's hash and its list of kept answers, under one hash tag."""
        session = f"{self.prefix}{{{session_id}}}"
        return [session, f"{session}:ids"]


def _answer_field(request_id: str) -> str:
    """The hash field of the answer kept for `request_id`."""
    return f"r:{request_id}"
