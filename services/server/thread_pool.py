"""Envs in the server process: `ThreadEnvPool` runs `EnvHost` calls in a pool of threads (`env_workers = 0`).

Cheapest to start, and enough for envs that wait on I/O or release the GIL; the GIL caps CPU-bound envs
at about one core. The interface it meets is `vistarl.services.server.env_pool.EnvPool`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
from typing import Any

from vistarl.clients.protocol import Observation, ResetResponse
from vistarl.httpserver.errors import ServiceError
from vistarl.services.env_api import EnvFactory
from vistarl.services.server.env_calls import EnvGoneError, EnvHost, Reply, Stepped, Task, guarded
from vistarl.services.server.settings import ServerSettings

logger = logging.getLogger(__name__)


class ThreadEnvPool:
    """Envs in this process, called in a pool of `env_threads` threads."""

    def __init__(self, factory: EnvFactory, settings: ServerSettings) -> None:
        self.settings = settings
        export_state = settings.session_store is not None
        self.host = EnvHost(factory, settings.max_image_bytes, settings.max_image_pixels, export_state)
        self._threads = concurrent.futures.ThreadPoolExecutor(
            max_workers=settings.env_threads, thread_name_prefix="vistarl-env"
        )

    async def open(self) -> None:
        return None

    async def started(self) -> None:
        return None

    async def start(
        self, session_id: str, task: Task, with_message: bool
    ) -> tuple[Reply[ResetResponse], bytes | None]:
        return await self._call("reset", session_id, self.host.start, session_id, task, with_message)

    async def step(self, session_id: str, action: str, with_message: bool) -> Stepped:
        return await self._call("step", session_id, self.host.step, session_id, action, with_message)

    async def restore(self, session_id: str, state: bytes) -> None:
        await self._call("restore", session_id, self.host.restore, session_id, state)

    async def close(self, session_id: str) -> None:
        await self._call("close", session_id, self.host.close, session_id)

    def discard(self, session_id: str) -> None:
        self.host.envs.pop(session_id, None)

    async def format(self, observation: Observation) -> bytes:
        return await self._call("format", None, self.host.format, observation)

    async def shutdown(self) -> None:
        with contextlib.suppress(ServiceError):
            await self._call("close", None, self.host.close_all)
        self._threads.shutdown(wait=False, cancel_futures=True)

    async def _call(self, what: str, session_id: str | None, fn: Any, *args: Any) -> Any:
        """Run `fn` in the pool within `env_timeout_s`.

        A timed-out call is abandoned: a queued one never starts, a running thread cannot be stopped and
        finishes alone (an env it creates or restores is then closed), and `EnvGoneError` tells the caller.
        """
        work = self._threads.submit(guarded, what, fn, *args)
        try:
            async with asyncio.timeout(self.settings.env_timeout_s):
                return await asyncio.wrap_future(work)
        except TimeoutError:
            if what in ("reset", "restore") and session_id is not None:
                work.add_done_callback(lambda _: self._close_late(session_id))
            logger.error("env %s exceeded %ss", what, self.settings.env_timeout_s)
            raise EnvGoneError(f"environment {what} exceeded {self.settings.env_timeout_s}s") from None

    def _close_late(self, session_id: str) -> None:
        """Close the env of a reset or restore that finished after its caller gave up on it."""
        with contextlib.suppress(Exception):
            self.host.close(session_id)
