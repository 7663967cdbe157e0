"""What one replica holds of the sessions: a lock per session, and the version of each env it holds.

A session's calls on this replica take its lock, so they run one at a time, in arrival order (asyncio's
locks are fair). An env held here is at the version recorded when it was reset, stepped or restored; with
a shared store another replica may have moved the session on since, which the manager finds out by
comparing this version with the store's. The envs held here are what counts against `max_sessions`
(capacity is per replica: docs/server.md, "Session store").
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from types import TracebackType


@dataclass
class _Lock:
    """A session's lock and how many calls hold or await it (the entry goes when none do)."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0


class SessionLock:
    """`async with` holds one session's lock; a plain class rather than an async generator, which would
    cost the event loop's generator bookkeeping on every call."""

    __slots__ = ("_entry", "_locks", "_session_id")

    def __init__(self, locks: dict[str, _Lock], session_id: str) -> None:
        self._locks = locks
        self._session_id = session_id
        self._entry: _Lock | None = None

    async def __aenter__(self) -> None:
        entry = self._locks.get(self._session_id)
        if entry is None:
            entry = self._locks[self._session_id] = _Lock()
        self._entry = entry
        entry.users += 1
        try:
            await entry.lock.acquire()
        except BaseException:
            self._leave(entry)
            raise

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._entry is not None
        self._entry.lock.release()
        self._leave(self._entry)

    def _leave(self, entry: _Lock) -> None:
        """One user fewer; the entry goes with the last."""
        entry.users -= 1
        if entry.users == 0:
            del self._locks[self._session_id]


class LocalSessions:
    """The per-session locks of this replica and the versions of the envs it holds."""

    def __init__(self) -> None:
        self._locks: dict[str, _Lock] = {}
        self._held: dict[str, int] = {}

    def lock(self, session_id: str) -> SessionLock:
        """Hold the session's lock for the `async with` block; locks exist only while someone holds or
        awaits them."""
        return SessionLock(self._locks, session_id)

    def busy(self, session_id: str) -> bool:
        """Whether a call holds or awaits the session's lock."""
        return session_id in self._locks

    def version(self, session_id: str) -> int | None:
        """The version of the session's env held here, None if none is."""
        return self._held.get(session_id)

    def hold(self, session_id: str, version: int) -> None:
        """Record that the env held here for the session is at `version`."""
        self._held[session_id] = version

    def release(self, session_id: str) -> bool:
        """Forget the session's env here; whether one was held."""
        return self._held.pop(session_id, None) is not None

    def idle(self) -> dict[str, int]:
        """The sessions held here that no call is using, with their versions."""
        return {sid: version for sid, version in self._held.items() if sid not in self._locks}

    def held(self) -> list[str]:
        """Every session whose env is held here."""
        return list(self._held)

    def __len__(self) -> int:
        return len(self._held)
