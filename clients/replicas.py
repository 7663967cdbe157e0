"""Which replica of an env server a call goes to, for a client given several base URLs.

A call starts at the replica its session lives on (where it was reset, or last answered), else at the
client's current replica. When a replica cannot be reached or answers 503, the call moves on to the
next one, and so does the client's current replica, so that later calls do not try the failed one first.
With a shared session store (`vistarl serve --session-store redis://...`) any replica serves any session,
so a session's calls fail over too; without one a session lives on one replica only, and its calls
elsewhere answer 404.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

MAX_SESSIONS_REMEMBERED = 65_536


class Replicas:
    """The base URLs of one env service, the current one, and the replica of each recent session."""

    def __init__(self, base_urls: Sequence[str]) -> None:
        if not base_urls:
            raise ValueError("give at least one base URL")
        self.urls = tuple(url.rstrip("/") for url in base_urls)
        self.current = 0
        self._homes: OrderedDict[str, int] = OrderedDict()

    def first(self, session_id: str | None) -> int:
        """The replica a call starts at: its session's, else the current one."""
        home = None if session_id is None else self._homes.get(session_id)
        return self.current if home is None else home

    def after(self, failed: int) -> int:
        """The replica to try after `failed`; the current one moves there unless a call moved it already."""
        following = (failed + 1) % len(self.urls)
        if self.current == failed:
            self.current = following
        return following

    def settle(self, session_id: str, replica: int) -> None:
        """Remember that `session_id` lives on `replica`, forgetting the oldest beyond the bound."""
        if len(self.urls) == 1:
            return
        self._homes[session_id] = replica
        self._homes.move_to_end(session_id)
        while len(self._homes) > MAX_SESSIONS_REMEMBERED:
            self._homes.popitem(last=False)

    def forget(self, session_id: str) -> None:
        """A session was closed."""
        self._homes.pop(session_id, None)
