"""The connection pool of vistarl's HTTP clients (the env clients and the SGLang engine client): one
aiohttp session, opened on first use for the event loop of that use.

aiohttp, because its cost per request stays flat with hundreds of requests in flight on kept-alive
connections. httpx's pool did not: 128 requests sent at once on connections kept from an earlier round
reached the server spread over seconds, where aiohttp's arrive together (`python -m benchmarks.http_burst`;
the figures in docs/benchmarks.md, "The HF engine's decode step").
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import aiohttp


class LoopPool:
    """An aiohttp session made on first use, because aiohttp ties it to the running event loop; a call
    from another loop, or after `close`, raises `RuntimeError` naming `owner`. `max_connections` 0 is no
    limit; idle connections close after `keepalive_s` (None: never)."""

    def __init__(
        self, owner: str, *, max_connections: int, keepalive_s: float | None, headers: Mapping[str, str]
    ) -> None:
        self.owner = owner
        self.max_connections = max_connections
        self.keepalive_s = keepalive_s
        self.headers = dict(headers)
        self.closed = False
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def session(self) -> aiohttp.ClientSession:
        """The session of the running loop, opened on the first call."""
        loop = asyncio.get_running_loop()
        if self.closed:
            raise RuntimeError(f"this {self.owner} is closed")
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self.max_connections, keepalive_timeout=self.keepalive_s)
            self._session = aiohttp.ClientSession(connector=connector, headers=self.headers)
            self._loop = loop
        elif loop is not self._loop:
            raise RuntimeError(f"a {self.owner} serves the event loop of its first call; make one per loop")
        return self._session

    async def close(self) -> None:
        """Close the session, if one was opened; later calls raise."""
        self.closed = True
        if self._session is not None:
            await self._session.close()
