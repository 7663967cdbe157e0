"""Both env clients behind one blocking interface, so that one test body checks each of them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from vistarl.clients import AsyncEnvClient, EnvClient


class BlockingAsyncClient:
    """An `AsyncEnvClient` whose calls run one at a time on an event loop of the test's thread (where
    `EnvClient` runs them on a thread of its own). Takes `AsyncEnvClient`'s arguments; use it as a
    context manager."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._runner = asyncio.Runner()
        self._client = AsyncEnvClient(*args, **kwargs)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._client, name)
        return lambda *args, **kwargs: self._runner.run(method(*args, **kwargs))

    def __enter__(self) -> BlockingAsyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self._runner.run(self._client.shutdown())
        self._runner.close()


Client = EnvClient | BlockingAsyncClient
