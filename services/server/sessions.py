"""Sessions of an environment server: the store they live in and the manager that applies the rules.

`SessionManager` owns the rules: bounded capacity, one step at a time per session (an `asyncio.Lock`),
different sessions in parallel (their envs run in an `EnvPool`, never on the event loop), idempotent
retries by `request_id`, and an idle-TTL reaper. Answers are the JSON bodies the pool produced.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio
from pydantic import BaseModel, ValidationError

from clients.protocol import ErrorCode, FormatRequest, ReadyResponse, ResetRequest, StepRequest
from services.env_api import EnvFactory
from services.server.env_pool import EnvGoneError, EnvPool
from services.server.env_work import Task
from services.server.errors import ServiceError, describe_validation_errors
from services.server.metrics import ServerMetrics
from services.server.settings import ServerSettings
from services.server.tasks import TaskCatalog

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class Session:
    """One live episode (its env lives in the pool): whether it ended, its last answer (what MCP's
    `observe` shows), and the answers kept for retries, each with a digest of the action it answered."""

    id: str
    done: bool = False
    closed: bool = False
    last_active: float = field(default_factory=time.monotonic)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_answer: bytes = b""
    answers: OrderedDict[str, tuple[bytes, bytes]] = field(default_factory=OrderedDict)

    def remember(self, request_id: str, action: str, answer: bytes, limit: int) -> None:
        """Keep `answer` for retries of `request_id`, forgetting the oldest beyond `limit`."""
        self.answers[request_id] = (_digest(action), answer)
        while len(self.answers) > limit:
            self.answers.popitem(last=False)

    def replay(self, request_id: str | None, action: str) -> bytes | None:
        """The stored answer of a retried step, None for a new one; 409 `request_id_reused` when the id
        was used for a different action."""
        kept = None if request_id is None else self.answers.get(request_id)
        if kept is None:
            return None
        digest, answer = kept
        if digest != _digest(action):
            raise ServiceError(
                ErrorCode.REQUEST_ID_REUSED,
                f"request_id {request_id} of session {self.id} was sent before with another action; "
                "a new step needs a new request_id",
            )
        return answer

    def idle_seconds(self) -> float:
        """Seconds since the session was last stored."""
        return time.monotonic() - self.last_active


class SessionStore(Protocol):
    """Where sessions live between requests.

    The in-memory store keeps live `Session` objects. A shared store (Redis) would serialize a session and
    its answer cache in `put` and rebuild it in `get` (which is why the manager calls `put` after every
    change), lock through Redis, and let key TTLs do the expiry; the env state would then have to live
    there too, instead of in this server's pool.
    """

    async def get(self, session_id: str) -> Session | None:
        """The session, or None if unknown."""
        ...

    async def put(self, session: Session) -> None:
        """Insert or update a session and restart its idle clock."""
        ...

    async def delete(self, session_id: str) -> Session | None:
        """Remove a session; returns it, or None if it was not there."""
        ...

    async def count(self) -> int:
        """How many sessions are stored."""
        ...

    async def sessions(self) -> list[Session]:
        """Every stored session."""
        ...

    async def expired(self, idle_s: float) -> list[Session]:
        """The sessions idle for longer than `idle_s` seconds."""
        ...


class InMemorySessionStore:
    """A `SessionStore` in a dict, in this process."""

    def __init__(self) -> None:
        self._sessions: dict[str, Session] = {}

    async def get(self, session_id: str) -> Session | None:
        return self._sessions.get(session_id)

    async def put(self, session: Session) -> None:
        session.last_active = time.monotonic()
        self._sessions[session.id] = session

    async def delete(self, session_id: str) -> Session | None:
        return self._sessions.pop(session_id, None)

    async def count(self) -> int:
        return len(self._sessions)

    async def sessions(self) -> list[Session]:
        return list(self._sessions.values())

    async def expired(self, idle_s: float) -> list[Session]:
        return [s for s in self._sessions.values() if s.idle_seconds() > idle_s]


class SessionManager:
    """Runs reset/step/format/close for the server, enforcing capacity, ordering and retries."""

    def __init__(
        self,
        factory: EnvFactory,
        settings: ServerSettings,
        metrics: ServerMetrics,
        pool: EnvPool,
        tasks: TaskCatalog,
        store: SessionStore | None = None,
    ) -> None:
        self.factory = factory
        self.settings = settings
        self.metrics = metrics
        self.pool = pool
        self.tasks = tasks
        self.store: SessionStore = store or InMemorySessionStore()
        self.draining = False
        self._admission = asyncio.Lock()
        self._reserved: set[str] = set()

    # --- endpoints ------------------------------------------------------------------------------

    async def reset(self, request: ResetRequest) -> bytes:
        """Start an episode in a new session from its task (see `services.server.tasks`); 409 if a chosen
        `session_id` is taken, 503 when full."""
        options = self._validate_options(request.options)
        sample = await self._sample(request)
        session_id = request.session_id or uuid.uuid4().hex
        await self._reserve(session_id)
        try:
            answer = await self.pool.start(session_id, Task(options, request.seed, sample), request.format)
            await self.store.put(Session(id=session_id, last_answer=answer))
        finally:
            self._reserved.discard(session_id)
        self.metrics.resets.inc()
        await self._update_gauge()
        return answer

    async def step(self, request: StepRequest) -> bytes:
        """Step a session; a retried `request_id` gets the stored answer instead of a second step."""
        if len(request.action) > self.settings.max_action_chars:
            raise ServiceError(
                ErrorCode.VALIDATION_ERROR,
                f"action has {len(request.action)} characters; the limit is {self.settings.max_action_chars}",
            )
        session = await self._session(request.session_id)
        async with session.lock:
            if session.closed:
                raise _not_found(session.id)
            if (stored := session.replay(request.request_id, request.action)) is not None:
                return stored
            if session.done:
                raise ServiceError(ErrorCode.EPISODE_DONE, f"episode of session {session.id} is done; reset")
            started = time.perf_counter()
            try:
                done, answer = await self.pool.step(session.id, request.action, request.format)
            except EnvGoneError as exc:  # timed out (may still be running) or its worker died
                await self._retire(session, close_env=False)
                raise ServiceError(exc.code, f"{exc.message}; session {session.id} was closed") from None
            self.metrics.step_seconds.observe(time.perf_counter() - started)
            self.metrics.steps.inc()
            session.done = done
            session.last_answer = answer
            if request.request_id is not None:
                session.remember(
                    request.request_id, request.action, answer, self.settings.idempotency_cache_size
                )
            await self.store.put(session)
        return answer

    async def observe(self, session_id: str) -> bytes:
        """The session's last answer (its reset's or its last step's body); 404 if unknown."""
        session = await self._session(session_id)
        async with session.lock:
            if session.closed:
                raise _not_found(session_id)
            return session.last_answer

    async def format(self, request: FormatRequest) -> bytes:
        """Format a client's observation as a chat message; its images are decoded within the limits."""
        return await self.pool.format(request.observation)

    async def close(self, session_id: str) -> None:
        """End a session and close its env (after any step in flight); 404 if unknown."""
        session = await self._session(session_id)
        async with session.lock:
            if session.closed:
                raise _not_found(session_id)
            await self._retire(session)

    async def ready(self) -> ReadyResponse:
        """Readiness: not ready while draining or at capacity, so that a load balancer routes elsewhere."""
        active = await self.store.count()
        full = active + len(self._reserved) >= self.settings.max_sessions
        return ReadyResponse(
            ready=not (full or self.draining),
            active_sessions=active,
            max_sessions=self.settings.max_sessions,
            draining=self.draining,
        )

    # --- lifecycle ------------------------------------------------------------------------------

    async def run_reaper(self) -> None:
        """Reap idle sessions every `reaper_interval_s`, forever; a failed round is logged, not fatal."""
        while True:
            await anyio.sleep(self.settings.reaper_interval_s)
            try:
                await self.reap_expired()
            except Exception:
                logger.exception("session reaper round failed")

    async def reap_expired(self) -> int:
        """Close the sessions idle past the TTL (skipping any with a step in flight); returns how many."""
        reaped = 0
        for session in await self.store.expired(self.settings.session_ttl_s):
            if session.lock.locked():
                continue
            async with session.lock:
                if session.closed or session.idle_seconds() <= self.settings.session_ttl_s:
                    continue
                await self._retire(session)
                reaped += 1
        if reaped:
            logger.info("reaped %d idle sessions", reaped)
            self.metrics.expired_sessions.inc(reaped)
        return reaped

    async def shutdown(self) -> None:
        """Refuse new episodes, close every env (bounded by `shutdown_timeout_s`), then stop the pool."""
        self.draining = True
        with anyio.move_on_after(self.settings.shutdown_timeout_s):
            for session in await self.store.sessions():
                await self._retire(session)
        await self.pool.shutdown()

    # --- helpers --------------------------------------------------------------------------------

    def _validate_options(self, raw: dict[str, Any]) -> BaseModel:
        """The env options as the env's options model; 422 naming each bad field."""
        try:
            return self.factory.options_model.model_validate(raw)
        except ValidationError as exc:
            message = describe_validation_errors(exc.errors(), prefix="options")
            raise ServiceError(ErrorCode.INVALID_OPTIONS, message) from None

    async def _sample(self, request: ResetRequest) -> BaseModel | None:
        """The sample a reset names by `task_id` or sends inline, resolved off the event loop."""
        if request.task_id is None and request.sample is None:
            return None
        return await anyio.to_thread.run_sync(self.tasks.resolve, request)

    async def _reserve(self, session_id: str) -> None:
        """Claim a slot and the id for a session being created, or refuse (draining, taken, full)."""
        async with self._admission:
            if self.draining:
                raise ServiceError(ErrorCode.DRAINING, "server is shutting down", self.retry_after())
            if session_id in self._reserved or await self.store.get(session_id) is not None:
                raise ServiceError(
                    ErrorCode.SESSION_EXISTS,
                    f"session {session_id} already exists; delete it or pick another id",
                )
            active = await self.store.count() + len(self._reserved)
            if active >= self.settings.max_sessions:
                raise ServiceError(
                    ErrorCode.AT_CAPACITY,
                    f"at capacity: {active} of {self.settings.max_sessions} sessions in use; retry later",
                    self.retry_after(),
                )
            self._reserved.add(session_id)

    async def _session(self, session_id: str) -> Session:
        """The stored session, or 404."""
        session = await self.store.get(session_id)
        if session is None:
            raise _not_found(session_id)
        return session

    async def _retire(self, session: Session, close_env: bool = True) -> None:
        """Remove a session (caller holds its lock or the server is stopping) and close its env.

        A failing or hanging close is logged by the pool, never raised; `close_env=False` only forgets
        an env that is gone or cannot be trusted.
        """
        session.closed = True
        await self.store.delete(session.id)
        await self._update_gauge()
        if not close_env:
            self.pool.discard(session.id)
            return
        with contextlib.suppress(ServiceError):
            await self.pool.close(session.id)

    async def _update_gauge(self) -> None:
        self.metrics.active_sessions.set(await self.store.count())

    def retry_after(self) -> dict[str, str]:
        """The header of a 503 answer."""
        return {"Retry-After": str(self.settings.retry_after_s)}


def _digest(action: str) -> bytes:
    """A short fingerprint of an action, kept with its stored answer instead of the action itself."""
    return hashlib.blake2b(action.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def _not_found(session_id: str) -> ServiceError:
    return ServiceError(ErrorCode.SESSION_NOT_FOUND, f"unknown or expired session {session_id}")
