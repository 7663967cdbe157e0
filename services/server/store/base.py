"""The session store's interface and records: what a replica reads before a step and writes after it.

Per session a store keeps its version (steps committed so far), whether its episode is done, the answers
kept for `request_id` retries, its last answer (what MCP's `observe` shows again) and, in a shared store,
the env's state; the envs themselves and the rules
are `vistarl.services.server.sessions`' business. Both backends give the same semantics (docs/server.md,
"Session store"): `InMemorySessionStore` (`memory.py`) inside one process, `RedisSessionStore`
(`redis.py`) shared by every replica of one env.

- A commit is conditional: it is stored only while the session is still at the version its step started
  from, so no two steps are ever applied to one state, on one replica or on two. It also answers what a
  read before the step would have (unknown, done, or the stored answer of its `request_id`), so that a
  replica stepping an env it holds needs one round trip to a shared store, not two.
- A finished session becomes a tombstone for `tombstone_ttl_s`: its version, `done`, and the answer of its
  final step, kept for a 409 `episode_done` and for a retry of that step; no env state, no capacity.
- Idle expiry is a deadline: creating a session, reading it before a step and committing a step give it
  `session_ttl_s` afresh.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import msgpack

from vistarl.clients.protocol import ErrorCode
from vistarl.httpserver.errors import ServiceError


def action_digest(action: str) -> bytes:
    """A short fingerprint of an action, kept with its stored answer instead of the action itself."""
    return hashlib.blake2b(action.encode("utf-8", "surrogatepass"), digest_size=16).digest()


@dataclass(frozen=True)
class StoredAnswer:
    """The answer of one step, kept for retries of its `request_id`, with the digest of its action."""

    digest: bytes
    body: bytes

    def replay(self, session_id: str, request_id: str, action: str) -> bytes:
        """The stored body for a retry of the same action; 409 `request_id_reused` for another action."""
        if self.digest != action_digest(action):
            raise ServiceError(
                ErrorCode.REQUEST_ID_REUSED,
                f"request_id {request_id} of session {session_id} was sent before with another action; "
                "a new step needs a new request_id",
            )
        return self.body

    def pack(self) -> bytes:
        """The answer as msgpack, as a shared store keeps it."""
        return bytes(msgpack.packb([self.digest, self.body]))

    @classmethod
    def unpack(cls, raw: bytes) -> StoredAnswer:
        """The answer that `pack` wrote."""
        digest, body = msgpack.unpackb(raw)
        return cls(bytes(digest), bytes(body))


@dataclass(frozen=True)
class Retention:
    """What a store keeps, and how long: live sessions `ttl_s` after their last use, tombstones
    `tombstone_ttl_s` after their final step, and the last `answers_kept` answers of each live session."""

    ttl_s: float
    tombstone_ttl_s: float
    answers_kept: int


@dataclass(frozen=True)
class Snapshot:
    """What a step reads first: the session's version, whether it is done, and the stored answer of the
    step's `request_id` if it has one."""

    version: int
    done: bool
    answer: StoredAnswer | None


@dataclass(frozen=True)
class StepRecord:
    """What a step writes: its answer (under its `request_id`, if any), whether it ended the episode, and
    the env's state after it (None in a store that keeps no states)."""

    request_id: str | None
    answer: StoredAnswer
    done: bool
    state: bytes | None


class Commit(enum.Enum):
    """How a commit ended, when it did not find the step's `request_id` answered already."""

    STORED = "stored"
    CONFLICT = "conflict"  # another step of the session was committed since the version this one stepped
    DONE = "done"  # the episode ended meanwhile
    GONE = "gone"  # the session is unknown: deleted or expired


class SessionStore(Protocol):
    """Where sessions live between requests. `shared` stores are read by other processes too, so they keep
    each env's state (`Env.state()` as msgpack), from which any replica restores the env."""

    shared: bool

    async def open(self) -> None:
        """Check that the store can be reached; raises with a message naming it if not."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...

    async def create(self, session_id: str, state: bytes | None, answer: bytes) -> bool:
        """Store a new session at version 0 with its reset's answer; False when the id is taken (a live
        session or a tombstone)."""
        ...

    async def snapshot(self, session_id: str, request_id: str | None) -> Snapshot | None:
        """The session before a step (giving a live one its TTL afresh), or None if unknown or expired."""
        ...

    async def state(self, session_id: str) -> tuple[int, bytes] | None:
        """The version and env state of a live session, or None (unknown, finished, or not kept here)."""
        ...

    async def commit(self, session_id: str, version: int, record: StepRecord) -> Commit | StoredAnswer:
        """Store a step that started from `version`, unless the session moved on, ended or went away; the
        stored answer instead if the step's `request_id` was answered already (nothing is stored)."""
        ...

    async def last_answer(self, session_id: str) -> bytes | None:
        """The answer of the session's reset or last step (a tombstone's too), or None if unknown."""
        ...

    async def delete(self, session_id: str) -> bool:
        """Remove a session or its tombstone; False if there was none."""
        ...

    async def versions(self, session_ids: Sequence[str]) -> list[int | None]:
        """The current version of each session (a tombstone's too), None for those unknown or expired."""
        ...
