"""`InMemorySessionStore`: the session store of a single server process, in a dict.

It keeps no env states (`shared` is False): a session's env lives only in this process, and a session
whose env is lost cannot continue. Deadlines are on the monotonic clock; an expired record is dropped
when it is next read, and tombstones, which expire in the order they were made, are also purged from the
oldest whenever a session is created or finishes, so that finished episodes cannot pile up unread.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from vistarl.services.server.store.base import Commit, Retention, Snapshot, StepRecord, StoredAnswer


@dataclass
class _Record:
    """One session: its version, whether it is a tombstone, its deadline and the answers kept."""

    expires: float
    version: int = 0
    done: bool = False
    last: bytes = b""
    answers: OrderedDict[str, StoredAnswer] = field(default_factory=OrderedDict)


class InMemorySessionStore:
    """A `SessionStore` in this process (docs/server.md, "Session store")."""

    shared = False

    def __init__(self, retention: Retention) -> None:
        self.retention = retention
        self._records: dict[str, _Record] = {}
        self._tombstones: deque[tuple[float, str]] = deque()

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def create(self, session_id: str, state: bytes | None, answer: bytes) -> bool:
        self._purge_tombstones()
        if self._live(session_id) is not None:
            return False
        self._records[session_id] = _Record(expires=time.monotonic() + self.retention.ttl_s, last=answer)
        return True

    async def snapshot(self, session_id: str, request_id: str | None) -> Snapshot | None:
        record = self._live(session_id)
        if record is None:
            return None
        if not record.done:
            record.expires = time.monotonic() + self.retention.ttl_s
        answer = None if request_id is None else record.answers.get(request_id)
        return Snapshot(record.version, record.done, answer)

    async def state(self, session_id: str) -> tuple[int, bytes] | None:
        return None

    async def commit(self, session_id: str, version: int, record: StepRecord) -> Commit | StoredAnswer:
        kept = self._live(session_id)
        if kept is None:
            return Commit.GONE
        if record.request_id is not None and (answered := kept.answers.get(record.request_id)) is not None:
            return answered
        if kept.done:
            return Commit.DONE
        if kept.version != version:
            return Commit.CONFLICT
        kept.version += 1
        kept.last = record.answer.body
        if record.done:
            kept.done = True
            kept.answers.clear()
            kept.expires = time.monotonic() + self.retention.tombstone_ttl_s
            self._tombstones.append((kept.expires, session_id))
            self._purge_tombstones()
        else:
            kept.expires = time.monotonic() + self.retention.ttl_s
        if record.request_id is not None:
            kept.answers[record.request_id] = record.answer
            while len(kept.answers) > self.retention.answers_kept:
                kept.answers.popitem(last=False)
        return Commit.STORED

    async def last_answer(self, session_id: str) -> bytes | None:
        record = self._live(session_id)
        return None if record is None else record.last

    async def delete(self, session_id: str) -> bool:
        return self._live(session_id) is not None and self._records.pop(session_id, None) is not None

    async def versions(self, session_ids: Sequence[str]) -> list[int | None]:
        records = [self._live(session_id) for session_id in session_ids]
        return [None if record is None else record.version for record in records]

    def _live(self, session_id: str) -> _Record | None:
        """The record of `session_id` unless it expired (then it is dropped)."""
        record = self._records.get(session_id)
        if record is not None and record.expires <= time.monotonic():
            del self._records[session_id]
            return None
        return record

    def _purge_tombstones(self) -> None:
        """Drop the tombstones whose deadline passed, oldest first (a deleted or reused id is skipped)."""
        now = time.monotonic()
        while self._tombstones and self._tombstones[0][0] <= now:
            expires, session_id = self._tombstones.popleft()
            record = self._records.get(session_id)
            if record is not None and record.done and record.expires == expires:
                del self._records[session_id]
