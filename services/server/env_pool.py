"""Where env code runs: the interface of an env pool, and the factory that picks one.

Both pools host the envs of live sessions and run `vistarl.services.server.env_calls.EnvHost` calls off
the event loop, each bounded by `env_timeout_s`, answering with ready-to-send JSON bodies (with the
response itself too, from threads).

- `ThreadEnvPool` (`thread_pool.py`; `env_workers = 0`, the default on one core): a thread pool in the
  server process. Cheapest to start, and enough for envs that wait on I/O or release the GIL; the GIL caps
  CPU-bound envs at about one core.
- `ProcessEnvPool` (`process_pool.py`; `env_workers = N`, by default one per usable core): N `python -m
  vistarl.services.server.worker_process` processes. Each session lives in the worker that reset (or
  restored) it, so its steps always reach its env; new sessions go to the worker with the fewest. The event
  loop only routes requests: msgpack frames on each worker's stdin and stdout. The workers start in the
  background, so the server answers (`/health`) while they load the env; what needs one waits for them.
  A worker that dies or overruns the timeout is replaced; the envs it held are lost (500), and their
  sessions with them unless a shared session store can restore them.

With a shared session store (`session_store`), both return each env's state after a reset and every step,
and `restore` rebuilds a session's env from a stored state. A call whose env is gone raises
`env_calls.EnvGoneError`.
"""

from __future__ import annotations

from typing import Protocol

from vistarl.clients.protocol import Observation, ResetResponse
from vistarl.services.env_api import EnvFactory
from vistarl.services.server.env_calls import Reply, Stepped, Task
from vistarl.services.server.metrics import ServerMetrics
from vistarl.services.server.process_pool import ProcessEnvPool
from vistarl.services.server.settings import ServerSettings
from vistarl.services.server.thread_pool import ThreadEnvPool


class EnvPool(Protocol):
    """Runs env calls for the session manager; one call per session at a time is the caller's rule."""

    async def open(self) -> None:
        """Start what the pool needs (worker processes), without waiting for it: see `started`."""
        ...

    async def started(self) -> None:
        """Wait until the pool can run env calls (bounded); a 500 `ServiceError` naming why if it cannot."""
        ...

    async def start(
        self, session_id: str, task: Task, with_message: bool
    ) -> tuple[Reply[ResetResponse], bytes | None]:
        """Create and reset the env of a new session from its task: the `ResetResponse` and the env's state
        (None unless states are exported)."""
        ...

    async def step(self, session_id: str, action: str, with_message: bool) -> Stepped:
        """Step a session's env: whether it is done, the `StepResponse`, and the state. A step that ends
        the episode closes the env, which the pool then forgets."""
        ...

    async def restore(self, session_id: str, state: bytes) -> None:
        """Rebuild a session's env from its stored state, replacing any env the session had here."""
        ...

    async def close(self, session_id: str) -> None:
        """Close a session's env."""
        ...

    def discard(self, session_id: str) -> None:
        """Forget a session whose env is gone or untrusted, without calling it."""
        ...

    async def format(self, observation: Observation) -> bytes:
        """The `FormatResponse` body for a client's observation."""
        ...

    async def shutdown(self) -> None:
        """Close every env and stop (bounded by `shutdown_timeout_s`)."""
        ...


def create_pool(factory: EnvFactory, settings: ServerSettings, metrics: ServerMetrics) -> EnvPool:
    """The pool that `settings.env_workers` asks for, exporting env states for a shared session store.

    A factory without an import path cannot be loaded by worker processes: it runs in threads unless env
    workers were asked for by name."""
    chosen = "env_workers" in settings.model_fields_set
    if settings.env_workers == 0 or (factory.import_path is None and not chosen):
        return ThreadEnvPool(factory, settings)
    if factory.import_path is None:
        raise ValueError(
            f"env {factory.name!r} has no import path, so worker processes cannot load it: "
            "get the factory from vistarl.services.env_api.load_env_factory, or set env_workers=0"
        )
    return ProcessEnvPool(factory.import_path, settings, metrics)
