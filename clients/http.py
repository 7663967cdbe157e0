"""HTTP clients for environment servers: `EnvClient` (blocking) and `AsyncEnvClient` (asyncio), on httpx.

Every API call is first described as a `Call` (request, retry safety, decoder) and then run by a
short I/O loop. The decisions -- whether and when to retry, how a response becomes a model or a
typed exception -- are pure functions shared by both clients; only the sleeping and sending differ.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import logging
import os
import random
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ValidationError

from clients.errors import EnvClientError, EnvConnectionError, EnvServerError, ProtocolError, error_for_status
from clients.protocol import (
    ErrorResponse,
    FormatRequest,
    FormatResponse,
    HealthResponse,
    InfoResponse,
    Message,
    Observation,
    ReadyResponse,
    ResetRequest,
    ResetResponse,
    StepRequest,
    StepResponse,
)

__all__ = [
    "DEFAULT_LIMITS",
    "TOKEN_ENV_VAR",
    "AsyncEnvClient",
    "AsyncEpisode",
    "EnvClient",
    "Episode",
    "RetryPolicy",
]

log = logging.getLogger(__name__)

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)

TOKEN_ENV_VAR = "VISTARL_API_TOKEN"
DEFAULT_TIMEOUT_S = 30.0
DEFAULT_LIMITS = httpx.Limits(max_connections=512, max_keepalive_connections=128, keepalive_expiry=4.0)

# Failures where the request never reached the server: always safe to resend.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
# Failures where the server may have acted on the request: resend only idempotent calls.
_MAYBE_APPLIED = (
    httpx.ReadTimeout,
    httpx.WriteTimeout,
    httpx.ReadError,
    httpx.WriteError,
    httpx.RemoteProtocolError,
)

Outcome = httpx.Response | httpx.TransportError


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded retries: at most `max_attempts` tries with jittered backoff, all within `deadline_s`."""

    max_attempts: int = 5
    base_delay: float = 0.2
    max_delay: float = 5.0
    deadline_s: float = 60.0
    retry_statuses: frozenset[int] = field(default_factory=lambda: frozenset({429, 503}))

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if not 0 <= self.base_delay <= self.max_delay:
            raise ValueError(f"need 0 <= base_delay <= max_delay, got {self.base_delay}, {self.max_delay}")
        if self.deadline_s <= 0:
            raise ValueError(f"deadline_s must be > 0, got {self.deadline_s}")

    def delay(self, attempt: int, retry_after: float | None) -> float:
        """The wait before retry number `attempt` (1-based): the server's Retry-After plus jitter if
        given, else full-jitter exponential backoff, so that many clients do not retry in step."""
        if retry_after is not None:
            return retry_after + random.uniform(0, self.base_delay)
        return random.uniform(0, min(self.max_delay, self.base_delay * 2 ** (attempt - 1)))


def retry_after_seconds(value: str | None) -> float | None:
    """Seconds from now named by a `Retry-After` header (delta-seconds or HTTP-date); None if absent/bad."""
    if not value:
        return None
    with contextlib.suppress(ValueError):
        return max(0.0, float(value))
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())


def retry_delay(
    policy: RetryPolicy, outcome: Outcome, *, attempt: int, idempotent: bool, remaining: float
) -> float | None:
    """Seconds to wait before retrying after `outcome` of attempt number `attempt`, or None to stop.

    Retries busy statuses (honouring Retry-After) and unsent requests always; lost responses only
    when the call is idempotent. Never schedules a retry that would start past the deadline.
    """
    if attempt >= policy.max_attempts:
        return None
    if isinstance(outcome, httpx.Response):
        if outcome.status_code not in policy.retry_statuses:
            return None
        delay = policy.delay(attempt, retry_after_seconds(outcome.headers.get("retry-after")))
    elif isinstance(outcome, _NOT_SENT) or (idempotent and isinstance(outcome, _MAYBE_APPLIED)):
        delay = policy.delay(attempt, None)
    else:
        return None
    return delay if delay < remaining else None


def error_from_response(response: httpx.Response) -> EnvServerError:
    """The typed exception for an error response; a non-JSON or foreign body still gets its status's type."""
    try:
        detail = ErrorResponse.model_validate_json(response.content).error
        code, message = detail.code, detail.message
    except ValidationError:
        code = f"http_{response.status_code}"
        message = response.text.strip()[:500] or response.reason_phrase
    return error_for_status(response.status_code, code, message)


def decode_response(response: httpx.Response, model: type[M]) -> M:
    """Validate a success body into `model`; raise the typed exception for an error status."""
    if not response.is_success:
        raise error_from_response(response)
    try:
        return model.model_validate_json(response.content)
    except ValidationError as exc:
        raise ProtocolError(
            f"{response.request.url} answered a body that is not a {model.__name__}: {exc}"
        ) from None


def decode_closed(response: httpx.Response) -> bool:
    """True if the session was deleted, False if it was already gone (404); other errors raise."""
    if response.status_code == 404:
        return False
    if not response.is_success:
        raise error_from_response(response)
    return True


@dataclass(frozen=True)
class Call(Generic[T]):
    """One API call described without I/O: the request, whether resending it is safe, and its decoder.

    A `probe` (health, readiness) reports the current state, so it is tried once and never retried.
    """

    method: str
    path: str
    decode: Callable[[httpx.Response], T]
    body: BaseModel | None = None
    idempotent: bool = True
    probe: bool = False

    def request_kwargs(self) -> dict[str, Any]:
        """The body and headers of the request, for `httpx.Client.request`."""
        if self.body is None:
            return {}
        return {
            "content": self.body.model_dump_json(exclude_none=True),
            "headers": {"content-type": "application/json"},
        }


def reset_call(
    seed: int | None, options: Mapping[str, Any] | None, session_id: str | None, format: bool
) -> Call[ResetResponse]:
    """POST /reset. Not resent after a lost response, which could have started a second session."""
    body = ResetRequest(seed=seed, options=dict(options or {}), session_id=session_id, format=format)
    return Call("POST", "/reset", lambda r: decode_response(r, ResetResponse), body, idempotent=False)


def step_call(session_id: str, action: str, request_id: str | None, format: bool) -> Call[StepResponse]:
    """POST /step with a request_id (a fresh uuid4 unless given), which makes resending it safe."""
    body = StepRequest(
        session_id=session_id, action=action, request_id=request_id or uuid.uuid4().hex, format=format
    )
    return Call("POST", "/step", lambda r: decode_response(r, StepResponse), body)


def format_call(observation: Observation | Mapping[str, Any]) -> Call[Message]:
    """POST /format: the chat message the server's environment makes of an observation."""
    body = FormatRequest(observation=Observation.model_validate(observation))
    return Call("POST", "/format", lambda r: decode_response(r, FormatResponse).message, body)


def close_call(session_id: str) -> Call[bool]:
    """DELETE /sessions/{id}; a session that is already gone is not an error."""
    return Call("DELETE", f"/sessions/{quote(session_id, safe='')}", decode_closed)


INFO_CALL = Call("GET", "/info", lambda r: decode_response(r, InfoResponse))
HEALTH_CALL = Call("GET", "/health", lambda r: decode_response(r, HealthResponse), probe=True)
READY_CALL = Call("GET", "/ready", lambda r: decode_response(r, ReadyResponse), probe=True)


class _Attempts(Generic[T]):
    """The bookkeeping of one call's attempts: the per-attempt timeout, the deadline, the next delay."""

    def __init__(self, call: Call[T], policy: RetryPolicy, timeout: float, base_url: str) -> None:
        self.call = call
        self.policy = policy
        self.timeout = timeout
        self.base_url = base_url
        self.started = time.monotonic()
        self.deadline = self.started + policy.deadline_s
        self.count = 0

    def next_timeout(self) -> httpx.Timeout:
        """Count a new attempt and give it the request timeout, cut short by the call's deadline."""
        self.count += 1
        return httpx.Timeout(max(0.001, min(self.timeout, self.deadline - time.monotonic())))

    def next_delay(self, outcome: Outcome) -> float | None:
        """Seconds to wait before the next attempt, or None when `outcome` is final."""
        if self.call.probe:
            return None
        remaining = self.deadline - time.monotonic()
        idempotent = self.call.idempotent
        delay = retry_delay(
            self.policy, outcome, attempt=self.count, idempotent=idempotent, remaining=remaining
        )
        if delay is not None:
            reason = outcome.status_code if isinstance(outcome, httpx.Response) else type(outcome).__name__
            log.info(
                "%s %s: %s, retry %d in %.2fs", self.call.method, self.call.path, reason, self.count, delay
            )
        return delay

    def finish(self, outcome: Outcome) -> T:
        """Decode the final response, or turn the final transport failure into `EnvConnectionError`."""
        if isinstance(outcome, httpx.Response):
            return self.call.decode(outcome)
        elapsed = time.monotonic() - self.started
        raise EnvConnectionError(
            f"{self.call.method} {self.base_url}{self.call.path} failed after {self.count} attempt(s) "
            f"in {elapsed:.1f}s: {type(outcome).__name__}: {outcome}"
        ) from outcome


def _client_options(
    base_url: str,
    token: str | None,
    limits: httpx.Limits | None,
    headers: Mapping[str, str] | None,
) -> dict[str, Any]:
    """The httpx client settings both clients share: base URL, bearer token, pool limits."""
    token = os.environ.get(TOKEN_ENV_VAR) if token is None else token
    all_headers = {"accept": "application/json", **(headers or {})}
    if token:
        all_headers["authorization"] = f"Bearer {token}"
    return {"base_url": base_url, "headers": all_headers, "limits": limits or DEFAULT_LIMITS}


@contextlib.contextmanager
def _logging_close_errors(session_id: str) -> Iterator[None]:
    """While the episode's own error propagates, a failed close is logged instead of hiding it."""
    try:
        yield
    except EnvClientError as exc:
        log.warning("could not close session %s: %s", session_id, exc)


class _EpisodeState:
    """What an episode has seen so far; the sync and async episode handles share it."""

    def __init__(self, first: ResetResponse, format: bool) -> None:
        self.session_id = first.session_id
        self.observation = first.observation
        self.info = first.info
        self.message = first.message
        self.format = format
        self.reward = 0.0
        self.total_reward = 0.0
        self.done = False
        self.turns = 0

    def _record(self, result: StepResponse) -> StepResponse:
        """Fold one step's result into the episode's state and pass it on."""
        self.observation = result.observation
        self.info = result.info
        self.message = result.message
        self.reward = result.reward
        self.total_reward += result.reward
        self.done = result.done
        self.turns += 1
        return result


class EnvClient:
    """A blocking client for one environment server; thread-safe, with a shared connection pool.

    `token` defaults to $VISTARL_API_TOKEN (pass "" for none). `timeout` is per attempt; `retry`
    bounds attempts and total time per call. Use as a context manager, or call `shutdown()`.
    """

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        retry: RetryPolicy | None = None,
        limits: httpx.Limits | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.retry = retry or RetryPolicy()
        self._http = httpx.Client(**_client_options(self.base_url, token, limits, headers))

    def reset(
        self,
        *,
        seed: int | None = None,
        options: Mapping[str, Any] | None = None,
        session_id: str | None = None,
        format: bool = False,
        timeout: float | None = None,
    ) -> ResetResponse:
        """Start an episode; returns its session id and first observation."""
        return self._run(reset_call(seed, options, session_id, format), timeout)

    def step(
        self,
        session_id: str,
        action: str,
        *,
        request_id: str | None = None,
        format: bool = False,
        timeout: float | None = None,
    ) -> StepResponse:
        """Send one action; resent safely on a lost response because it carries a request_id."""
        return self._run(step_call(session_id, action, request_id, format), timeout)

    def format(
        self, observation: Observation | Mapping[str, Any], *, timeout: float | None = None
    ) -> Message:
        """The environment's chat message for an observation."""
        return self._run(format_call(observation), timeout)

    def close(self, session_id: str, *, timeout: float | None = None) -> bool:
        """End a session; True if it was deleted, False if it was already gone."""
        return self._run(close_call(session_id), timeout)

    def info(self, *, timeout: float | None = None) -> InfoResponse:
        """The environment's name, prompts, options schema and limits."""
        return self._run(INFO_CALL, timeout)

    def health(self, *, timeout: float | None = None) -> HealthResponse:
        """Liveness, tried once."""
        return self._run(HEALTH_CALL, timeout)

    def ready(self, *, timeout: float | None = None) -> ReadyResponse:
        """Readiness, tried once; raises `ServerBusyError` (code draining / at_capacity) when not ready."""
        return self._run(READY_CALL, timeout)

    @contextlib.contextmanager
    def episode(
        self,
        *,
        seed: int | None = None,
        options: Mapping[str, Any] | None = None,
        session_id: str | None = None,
        format: bool = False,
    ) -> Iterator[Episode]:
        """Reset, yield an `Episode`, and always close its session on the way out."""
        first = self.reset(seed=seed, options=options, session_id=session_id, format=format)
        ep = Episode(self, first, format)
        try:
            yield ep
        except BaseException:
            with _logging_close_errors(ep.session_id):
                ep.close()
            raise
        ep.close()

    def shutdown(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> EnvClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def _run(self, call: Call[T], timeout: float | None) -> T:
        """Send `call` with bounded retries and decode the final outcome."""
        attempts = _Attempts(call, self.retry, timeout or self.timeout, self.base_url)
        while True:
            outcome: Outcome
            try:
                outcome = self._http.request(
                    call.method, call.path, timeout=attempts.next_timeout(), **call.request_kwargs()
                )
            except httpx.TransportError as exc:
                outcome = exc
            delay = attempts.next_delay(outcome)
            if delay is None:
                return attempts.finish(outcome)
            time.sleep(delay)


class AsyncEnvClient:
    """The asyncio twin of `EnvClient`: same arguments, same behaviour, awaitable methods."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        retry: RetryPolicy | None = None,
        limits: httpx.Limits | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.retry = retry or RetryPolicy()
        self._http = httpx.AsyncClient(**_client_options(self.base_url, token, limits, headers))

    async def reset(
        self,
        *,
        seed: int | None = None,
        options: Mapping[str, Any] | None = None,
        session_id: str | None = None,
        format: bool = False,
        timeout: float | None = None,
    ) -> ResetResponse:
        """Start an episode; returns its session id and first observation."""
        return await self._run(reset_call(seed, options, session_id, format), timeout)

    async def step(
        self,
        session_id: str,
        action: str,
        *,
        request_id: str | None = None,
        format: bool = False,
        timeout: float | None = None,
    ) -> StepResponse:
        """Send one action; resent safely on a lost response because it carries a request_id."""
        return await self._run(step_call(session_id, action, request_id, format), timeout)

    async def format(
        self, observation: Observation | Mapping[str, Any], *, timeout: float | None = None
    ) -> Message:
        """The environment's chat message for an observation."""
        return await self._run(format_call(observation), timeout)

    async def close(self, session_id: str, *, timeout: float | None = None) -> bool:
        """End a session; True if it was deleted, False if it was already gone."""
        return await self._run(close_call(session_id), timeout)

    async def info(self, *, timeout: float | None = None) -> InfoResponse:
        """The environment's name, prompts, options schema and limits."""
        return await self._run(INFO_CALL, timeout)

    async def health(self, *, timeout: float | None = None) -> HealthResponse:
        """Liveness, tried once."""
        return await self._run(HEALTH_CALL, timeout)

    async def ready(self, *, timeout: float | None = None) -> ReadyResponse:
        """Readiness, tried once; raises `ServerBusyError` (code draining / at_capacity) when not ready."""
        return await self._run(READY_CALL, timeout)

    @contextlib.asynccontextmanager
    async def episode(
        self,
        *,
        seed: int | None = None,
        options: Mapping[str, Any] | None = None,
        session_id: str | None = None,
        format: bool = False,
    ) -> AsyncIterator[AsyncEpisode]:
        """Reset, yield an `AsyncEpisode`, and always close its session on the way out."""
        first = await self.reset(seed=seed, options=options, session_id=session_id, format=format)
        ep = AsyncEpisode(self, first, format)
        try:
            yield ep
        except BaseException:
            with _logging_close_errors(ep.session_id):
                await ep.close()
            raise
        await ep.close()

    async def shutdown(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    async def __aenter__(self) -> AsyncEnvClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    async def _run(self, call: Call[T], timeout: float | None) -> T:
        """Send `call` with bounded retries and decode the final outcome."""
        attempts = _Attempts(call, self.retry, timeout or self.timeout, self.base_url)
        while True:
            outcome: Outcome
            try:
                outcome = await self._http.request(
                    call.method, call.path, timeout=attempts.next_timeout(), **call.request_kwargs()
                )
            except httpx.TransportError as exc:
                outcome = exc
            delay = attempts.next_delay(outcome)
            if delay is None:
                return attempts.finish(outcome)
            await asyncio.sleep(delay)


class Episode(_EpisodeState):
    """A live episode of an `EnvClient`: its latest observation, rewards so far, and `step()`."""

    def __init__(self, client: EnvClient, first: ResetResponse, format: bool) -> None:
        super().__init__(first, format)
        self._client = client

    def step(
        self, action: str, *, request_id: str | None = None, timeout: float | None = None
    ) -> StepResponse:
        """Send one action and record its result."""
        result = self._client.step(
            self.session_id, action, request_id=request_id, format=self.format, timeout=timeout
        )
        return self._record(result)

    def close(self) -> bool:
        """End the session (False if it was already gone)."""
        return self._client.close(self.session_id)


class AsyncEpisode(_EpisodeState):
    """A live episode of an `AsyncEnvClient`: its latest observation, rewards so far, and `await step()`."""

    def __init__(self, client: AsyncEnvClient, first: ResetResponse, format: bool) -> None:
        super().__init__(first, format)
        self._client = client

    async def step(
        self, action: str, *, request_id: str | None = None, timeout: float | None = None
    ) -> StepResponse:
        """Send one action and record its result."""
        result = await self._client.step(
            self.session_id, action, request_id=request_id, format=self.format, timeout=timeout
        )
        return self._record(result)

    async def close(self) -> bool:
        """End the session (False if it was already gone)."""
        return await self._client.close(self.session_id)
