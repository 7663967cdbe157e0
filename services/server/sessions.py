"""Sessions of an environment server: the rules, applied over a session store and an env pool.

`SessionManager` runs reset, step, format and close. It bounds capacity (per replica: the envs it holds),
runs one call at a time per session (`LocalSessions`' locks) and different sessions in parallel (their
envs run in an `EnvPool`, never on the event loop), replays retried `request_id`s, and releases what
expired. Session records live in a `SessionStore` (`vistarl.services.server.store`): in this process by
default, or in Redis, shared by the replicas of one env together with each env's state, so that any replica
can serve any step (docs/server.md, "Session store"). A step:

1. reads the session from the store: unknown is 404, a stored answer of its `request_id` is replayed,
   a finished episode is 409;
2. makes sure the env held here is at the store's version, restoring it from the stored state if not;
3. steps the env;
4. commits the step only if the session is still at that version; if another replica committed first,
   it starts over from 1 (at most `COMMIT_ATTEMPTS` tries);
5. a step that ends the episode closes the env and frees its slot at once; the store keeps a tombstone.

With a shared store and the session's env held here, a step skips 1 and 2: the commit answers what the
read would have, and the env, stepped for nothing when it does, is dropped (the next try restores it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import anyio
from pydantic import BaseModel, ValidationError

from vistarl.clients.protocol import (
    ErrorCode,
    FormatRequest,
    ReadyResponse,
    ResetRequest,
    ResetResponse,
    StepRequest,
    StepResponse,
)
from vistarl.httpserver.errors import ServiceError, describe_validation_errors
from vistarl.services.env_api import EnvFactory
from vistarl.services.server.env_calls import EnvGoneError, EnvLostError, Reply, Stepped, Task
from vistarl.services.server.env_pool import EnvPool
from vistarl.services.server.local_sessions import LocalSessions
from vistarl.services.server.metrics import ServerMetrics
from vistarl.services.server.settings import ServerSettings
from vistarl.services.server.store import create_store
from vistarl.services.server.store.base import (
    Commit,
    SessionStore,
    Snapshot,
    StepRecord,
    StoredAnswer,
    action_digest,
)
from vistarl.services.server.tasks import TaskCatalog

logger = logging.getLogger(__name__)

COMMIT_ATTEMPTS = 4  # a step that keeps losing its commit to other replicas answers 503 session_busy


@dataclass(eq=False)
class SessionManager:
    """Runs reset/step/format/close for the server, enforcing capacity, ordering and retries."""

    factory: EnvFactory
    settings: ServerSettings
    metrics: ServerMetrics
    pool: EnvPool
    tasks: TaskCatalog
    store: SessionStore = field(init=False)
    local: LocalSessions = field(default_factory=LocalSessions, init=False)
    draining: bool = field(default=False, init=False)
    _admission: asyncio.Lock = field(default_factory=asyncio.Lock, init=False)
    _claimed: int = field(default=0, init=False)  # slots claimed by resets and restores under way

    def __post_init__(self) -> None:
        self.store = create_store(self.settings, self.factory.name)
        self.metrics.active_sessions.set_function(lambda: len(self.local))

    async def open(self) -> None:
        """Check that the session store answers, then start the env pool."""
        await self.store.open()
        await self.pool.open()

    # --- endpoints ------------------------------------------------------------------------------

    async def reset(self, request: ResetRequest) -> Reply[ResetResponse]:
        """Start an episode in a new session from its task (see `vistarl.services.server.tasks`); 409 if a
        chosen `session_id` is taken (live or finished), 503 when full."""
        options = self._validate_options(request.options)
        sample = await self._sample(request)
        session_id = request.session_id or uuid.uuid4().hex
        async with self.local.lock(session_id):
            if (await self.store.versions([session_id]))[0] is not None:
                raise _taken(session_id)
            await self._release(session_id)  # an env left here of a session that expired
            async with self._slot():
                task = Task(options, request.seed, sample)
                reply, state = await self.pool.start(session_id, task, request.format)
                await self._create(session_id, state, reply.body)
                self.local.hold(session_id, 0)
        self.metrics.resets.inc()
        return reply

    async def step(self, request: StepRequest) -> Reply[StepResponse]:
        """Step a session; a retried `request_id` gets the stored answer instead of a second step."""
        if len(request.action) > self.settings.max_action_chars:
            raise ServiceError(
                ErrorCode.VALIDATION_ERROR,
                f"action has {len(request.action)} characters; the limit is {self.settings.max_action_chars}",
            )
        async with self.local.lock(request.session_id):
            for _ in range(COMMIT_ATTEMPTS):
                answer = await self._attempt(request)
                if answer is not None:
                    return answer
        raise ServiceError(
            ErrorCode.SESSION_BUSY,
            f"session {request.session_id} was stepped on other replicas during each of {COMMIT_ATTEMPTS} "
            "tries of this step; retry it with the same request_id",
            self.retry_after(),
        )

    async def format(self, request: FormatRequest) -> bytes:
        """Format a client's observation as a chat message; its images are decoded within the limits."""
        return await self.pool.format(request.observation)

    async def observe(self, session_id: str) -> bytes:
        """The session's last answer (its reset's or its last step's body), from the store; 404 if unknown."""
        answer = await self.store.last_answer(session_id)
        if answer is None:
            raise _not_found(session_id)
        return answer

    async def progress(self, session_id: str) -> Snapshot:
        """The session's steps so far (its version) and whether it is done, from the store; 404 if unknown."""
        seen = await self.store.snapshot(session_id, None)
        if seen is None:
            raise _not_found(session_id)
        return seen

    async def close(self, session_id: str) -> None:
        """End a session (live or finished) and close its env here (after any step in flight); 404 if
        unknown."""
        async with self.local.lock(session_id):
            deleted = await self.store.delete(session_id)
            held = await self._release(session_id)
        if not (deleted or held):
            raise _not_found(session_id)

    async def ready(self) -> ReadyResponse:
        """Readiness: not ready while draining or at capacity, so that a load balancer routes elsewhere, nor
        when the env pool could not start (while it starts, this waits for it)."""
        try:
            await self.pool.started()
        except ServiceError:
            started = False
        else:
            started = True
        active = len(self.local)
        full = active + self._claimed >= self.settings.max_sessions
        return ReadyResponse(
            ready=started and not (full or self.draining),
            active_sessions=active,
            max_sessions=self.settings.max_sessions,
            draining=self.draining,
        )

    # --- lifecycle ------------------------------------------------------------------------------

    async def run_reaper(self) -> None:
        """Reap every `reaper_interval_s`, forever; a failed round is logged, not fatal."""
        while True:
            await anyio.sleep(self.settings.reaper_interval_s)
            try:
                await self.reap()
            except Exception:
                logger.exception("session reaper round failed")

    async def reap(self) -> int:
        """Close the envs held here whose session expired, ended or was stepped elsewhere since (skipping
        any with a call in flight); returns how many."""
        idle = self.local.idle()
        if not idle:
            return 0
        stored = await self.store.versions(list(idle))
        released = expired = 0
        for (session_id, version), now in zip(idle.items(), stored, strict=True):
            if now == version or self.local.busy(session_id) or self.local.version(session_id) != version:
                continue  # current, or a call took it up meanwhile
            async with self.local.lock(session_id):
                await self._release(session_id)
            released += 1
            expired += now is None
        if expired:
            logger.info("reaped %d expired sessions", expired)
            self.metrics.expired_sessions.inc(expired)
        return released

    async def shutdown(self) -> None:
        """Refuse new episodes, close every env held here (bounded by `shutdown_timeout_s`), then stop the
        pool. A shared store keeps the sessions, for the other replicas to continue."""
        self.draining = True
        with anyio.move_on_after(self.settings.shutdown_timeout_s):
            for session_id in self.local.held():
                await self._release(session_id)
        await self.pool.shutdown()
        await self.store.close()

    # --- the steps of a step --------------------------------------------------------------------

    async def _attempt(self, request: StepRequest) -> Reply[StepResponse] | None:
        """One try at a step (numbered as in the module docstring); None when it must start over."""
        session_id = request.session_id
        version = self.local.version(session_id)
        if version is None or not self.store.shared:
            seen = await self.store.snapshot(session_id, request.request_id)
            if seen is None:
                await self._release(session_id)
                raise _not_found(session_id)
            if seen.answer is not None:
                return self._replay(request, seen.answer)
            if seen.done:
                await self._release(session_id)
                raise _done(session_id)
            if not await self._bring_up_to(session_id, seen.version):
                return None
            version = seen.version
        stepped = await self._env_step(request)
        if stepped is None:
            return None
        return await self._commit(request, version, stepped)

    async def _bring_up_to(self, session_id: str, version: int) -> bool:
        """Make the env held here be at `version`, restoring it from the shared store if needed; False
        when the store has moved past `version` meanwhile."""
        if self.local.version(session_id) == version:
            return True
        if not self.store.shared:  # the env was lost, and no state was kept to rebuild it from
            await self._lose(session_id)
            raise _not_found(session_id)
        found = await self.store.state(session_id)
        if found is None or found[0] != version:
            return False
        held = self.local.version(session_id) is not None
        async with contextlib.nullcontext() if held else self._slot():
            try:
                await self.pool.restore(session_id, found[1])
            except EnvGoneError:
                await self._lose(session_id)
                raise
            except ServiceError:
                await self._release(session_id)
                raise
            self.local.hold(session_id, version)
        self.metrics.restored_sessions.inc()
        return True

    async def _env_step(self, request: StepRequest) -> Stepped | None:
        """Step the env held here; None when its env worker had died before the call (a shared store
        restores it and the step is tried again)."""
        session_id = request.session_id
        started = time.perf_counter()
        try:
            stepped = await self.pool.step(session_id, request.action, request.format)
        except EnvGoneError as exc:  # timed out (may still be running) or its worker died
            await self._lose(session_id)
            if isinstance(exc, EnvLostError) and self.store.shared:
                return None
            fate = "it goes on from its last step" if self.store.shared else "it was closed"
            raise ServiceError(exc.code, f"{exc.message}; session {session_id}: {fate}") from None
        except ServiceError:
            if self.store.shared:  # the env may be half-stepped: the store holds its last committed state
                await self._release(session_id)
            raise
        self.metrics.step_seconds.observe(time.perf_counter() - started)
        return stepped

    async def _commit(
        self, request: StepRequest, version: int, stepped: Stepped
    ) -> Reply[StepResponse] | None:
        """Store the step; its answer, or None when another replica committed a step first."""
        session_id = request.session_id
        answer = StoredAnswer(action_digest(request.action), stepped.reply.body)
        record = StepRecord(request.request_id, answer, stepped.done, stepped.state)
        try:
            outcome = await self.store.commit(session_id, version, record)
        except Exception:
            await self._release(session_id)  # stored or not, unknown: the env here may be ahead of the store
            raise
        if stepped.done:  # finished: the pool closed its env with the step, so its slot is free at once
            self.local.release(session_id)
        elif outcome is Commit.STORED:
            self.local.hold(session_id, version + 1)
        else:  # stepped for nothing: not the session's state now
            await self._release(session_id)
        if isinstance(outcome, StoredAnswer):
            return self._replay(request, outcome)
        if outcome is Commit.GONE:
            raise _not_found(session_id)
        if outcome is Commit.DONE:
            raise _done(session_id)
        if outcome is Commit.CONFLICT:
            return None
        self.metrics.steps.inc()
        return stepped.reply

    def _replay(self, request: StepRequest, answer: StoredAnswer) -> Reply[StepResponse]:
        """The stored answer of a retried step (the store found it under the step's `request_id`)."""
        assert request.request_id is not None, "answers are stored and found by request_id only"
        return Reply(answer.replay(request.session_id, request.request_id, request.action))

    # --- helpers --------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _slot(self) -> AsyncIterator[None]:
        """Claim a slot for an env about to be held here (a reset or a restore), or refuse: draining, full.
        When full, the envs of sessions that moved on elsewhere are reaped first."""
        async with self._admission:
            if self.draining:
                raise ServiceError(ErrorCode.DRAINING, "server is shutting down", self.retry_after())
            if self._in_use() >= self.settings.max_sessions and self.store.shared:
                await self.reap()
            if (active := self._in_use()) >= self.settings.max_sessions:
                raise ServiceError(
                    ErrorCode.AT_CAPACITY,
                    f"at capacity: {active} of {self.settings.max_sessions} sessions in use; retry later",
                    self.retry_after(),
                )
            self._claimed += 1
        try:
            yield
        finally:
            self._claimed -= 1

    def _in_use(self) -> int:
        """Slots taken: envs held here, and those being created or restored."""
        return len(self.local) + self._claimed

    async def _create(self, session_id: str, state: bytes | None, answer: bytes) -> None:
        """Store a session whose env was just reset here; its env is closed if that fails, and 409 when
        another replica took the id meanwhile."""
        try:
            created = await self.store.create(session_id, state, answer)
        except Exception:
            await self._close_env(session_id)
            raise
        if not created:
            await self._close_env(session_id)
            raise _taken(session_id)

    async def _release(self, session_id: str) -> bool:
        """Close the env held here for a session, if any, freeing its slot; whether one was held. The
        caller holds the session's lock, or the server is stopping."""
        if not self.local.release(session_id):
            return False
        await self._close_env(session_id)
        return True

    async def _lose(self, session_id: str) -> None:
        """Forget the env held here for a session without calling it (it is gone or cannot be trusted).
        A store that keeps no states cannot bring the session back, so it ends."""
        self.local.release(session_id)
        self.pool.discard(session_id)
        if not self.store.shared:
            await self.store.delete(session_id)

    async def _close_env(self, session_id: str) -> None:
        """Close a session's env in the pool; a failing or hanging close is logged by the pool, not raised."""
        with contextlib.suppress(ServiceError):
            await self.pool.close(session_id)

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

    def retry_after(self) -> dict[str, str]:
        """The header of a 503 answer."""
        return {"Retry-After": str(self.settings.retry_after_s)}


def _not_found(session_id: str) -> ServiceError:
    return ServiceError(ErrorCode.SESSION_NOT_FOUND, f"unknown or expired session {session_id}")


def _done(session_id: str) -> ServiceError:
    return ServiceError(ErrorCode.EPISODE_DONE, f"episode of session {session_id} is done; reset")


def _taken(session_id: str) -> ServiceError:
    return ServiceError(
        ErrorCode.SESSION_EXISTS,
        f"session {session_id} already exists (live, or finished within tombstone_ttl_s); delete it or "
        "pick another id",
    )
