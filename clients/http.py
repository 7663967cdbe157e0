"""HTTP clients for environment servers: `EnvClient` (blocking, on httpx) and `AsyncEnvClient` (asyncio,
on aiohttp, whose connection pool stays cheap with hundreds of concurrent requests; see docs/client.md).

Every API call is first described as a `Call` (request, retry safety, decoder) and then run by a
short I/O loop. The decisions -- whether and when to retry, how an answer becomes a model or a
typed exception -- are pure functions of a library-neutral `Reply` or the library's exception, shared
by both clients; only the sleeping and sending differ.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import enum
import logging
import os
import random
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http import HTTPStatus
from typing import Any, Generic, TypeVar

import aiohttp
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
_JSON_CONTENT = {"content-type": "application/json"}

# Failures before the request reached the server (no connection, or none free in time).
_NOT_SENT: tuple[type[Exception], ...] = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.PoolTimeout,
    aiohttp.ConnectionTimeoutError,  # connect or pool wait; a subclass of TimeoutError, so listed first
    aiohttp.ClientConnectorError,  # DNS, refused, TLS handshake
)
# Failures after the request was (maybe partly) sent: the server may have acted on it.
_MAYBE_APPLIED: tuple[type[Exception], ...] = (
    httpx.ReadTimeout,
    httpx.WriteTimeout,
    httpx.ReadError,
    httpx.WriteError,
    httpx.RemoteProtocolError,
    asyncio.TimeoutError,  # aiohttp's read timeout, and its total timeout once connected
    aiohttp.ClientConnectionError,  # server disconnected, connection reset, broken pipe
    aiohttp.ClientPayloadError,  # the body was cut short
    aiohttp.ClientResponseError,  # the answer was not valid HTTP
)


class Delivery(enum.Enum):
    """How far a request that got no answer went, which decides whether resending it is safe."""

    NOT_SENT = "not sent"  # it never reached the server: always safe to resend
    MAYBE_APPLIED = "maybe applied"  # the server may have acted on it: resend idempotent calls only
    FATAL = (
        "fatal"  # a fault of the request or the setup (bad URL, unsupported scheme): resending cannot help
    )


def delivery(error: Exception) -> Delivery:
    """Classify a transport exception of httpx or aiohttp by how far its request went."""
    if isinstance(error, _NOT_SENT):
        return Delivery.NOT_SENT
    if isinstance(error, _MAYBE_APPLIED):
        return Delivery.MAYBE_APPLIED
    return Delivery.FATAL


@dataclass(frozen=True)
class Reply:
    """An HTTP answer as the shared logic sees it, whichever library fetched it."""

    status: int
    body: bytes
    url: str
    retry_after: str | None = None

    @property
    def ok(self) -> bool:
        """A 2xx status."""
        return 200 <= self.status < 300

    @property
    def text(self) -> str:
        """The body as text, for error messages."""
        return self.body.decode("utf-8", errors="replace")


# An attempt ends with an answer or with the transport exception that stopped it.
Outcome = Reply | Exception


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
    if isinstance(outcome, Reply):
        if outcome.status not in policy.retry_statuses:
            return None
        delay = policy.delay(attempt, retry_after_seconds(outcome.retry_after))
    else:
        sent = delivery(outcome)
        if not (sent is Delivery.NOT_SENT or (idempotent and sent is Delivery.MAYBE_APPLIED)):
            return None
        delay = policy.delay(attempt, None)
    return delay if delay < remaining else None


def status_phrase(status: int) -> str:
    """The standard reason phrase of `status`, or "" for a status outside the standard."""
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""


def error_from_reply(reply: Reply) -> EnvServerError:
    """The typed exception for an error answer; a non-JSON or foreign body still gets its status's type."""
    try:
        detail = ErrorResponse.model_validate_json(reply.body).error
        code, message = detail.code, detail.message
    except ValidationError:
        code = f"http_{reply.status}"
        message = reply.text.strip()[:500] or status_phrase(reply.status)
    return error_for_status(reply.status, code, message)


def decode_reply(reply: Reply, model: type[M]) -> M:
    """Validate a success body into `model`; raise the typed exception for an error status."""
    if not reply.ok:
        raise error_from_reply(reply)
    try:
        return model.model_validate_json(reply.body)
    except ValidationError as exc:
        raise ProtocolError(f"{reply.url} answered a body that is not a {model.__name__}: {exc}") from None


def decode_closed(reply: Reply) -> bool:
    """True if the session was deleted, False if it was already gone (404); other errors raise."""
    if reply.status == 404:
        return False
    if not reply.ok:
        raise error_from_reply(reply)
    return True


@dataclass(frozen=True)
class Call(Generic[T]):
    """One API call described without I/O: the request, whether resending it is safe, and its decoder.

    A `probe` (health, readiness) reports the current state, so it is tried once and never retried.
    """

    method: str
    path: str
    decode: Callable[[Reply], T]
    body: BaseModel | None = None
    idempotent: bool = True
    probe: bool = False

    def content(self) -> bytes | None:
        """The JSON body of the request, if it has one."""
        return None if self.body is None else self.body.model_dump_json(exclude_none=True).encode()


def reset_call(
    seed: int | None,
    task_id: str | None,
    sample: Mapping[str, Any] | None,
    options: Mapping[str, Any] | None,
    session_id: str | None,
    format: bool,
) -> Call[ResetResponse]:
    """POST /reset. Not resent after a lost response, which could have started a second session."""
    body = ResetRequest(
        seed=seed,
        task_id=task_id,
        sample=None if sample is None else dict(sample),
        options=dict(options or {}),
        session_id=session_id,
        format=format,
    )
    return Call("POST", "/reset", lambda r: decode_reply(r, ResetResponse), body, idempotent=False)


def step_call(session_id: str, action: str, request_id: str | None, format: bool) -> Call[StepResponse]:
    """POST /step with a request_id (a fresh uuid4 unless given), which makes resending it safe."""
    body = StepRequest(
        session_id=session_id, action=action, request_id=request_id or uuid.uuid4().hex, format=format
    )
    return Call("POST", "/step", lambda r: decode_reply(r, StepResponse), body)


def format_call(observation: Observation | Mapping[str, Any]) -> Call[Message]:
    """POST /format: the chat message the server's environment makes of an observation."""
    body = FormatRequest(observation=Observation.model_validate(observation))
    return Call("POST", "/format", lambda r: decode_reply(r, FormatResponse).message, body)


def close_call(session_id: str) -> Call[bool]:
    """DELETE /sessions/{id}; a session that is already gone is not an error."""
    return Call("DELETE", f"/sessions/{urllib.parse.quote(session_id, safe='')}", decode_closed)


INFO_CALL = Call("GET", "/info", lambda r: decode_reply(r, InfoResponse))
HEALTH_CALL = Call("GET", "/health", lambda r: decode_reply(r, HealthResponse), probe=True)
READY_CALL = Call("GET", "/ready", lambda r: decode_reply(r, ReadyResponse), probe=True)


class _Attempts(Generic[T]):
    """The bookkeeping of one call's attempts: its body, the per-attempt timeout, the deadline, the delay."""

    def __init__(self, call: Call[T], policy: RetryPolicy, timeout: float, base_url: str) -> None:
        self.call = call
        self.policy = policy
        self.timeout = timeout
        self.url = base_url + call.path
        self.content = call.content()
        self.headers = None if self.content is None else _JSON_CONTENT
        self.started = time.monotonic()
        self.deadline = self.started + policy.deadline_s
        self.count = 0

    def remaining(self) -> float:
        """Seconds left before the call's deadline."""
        return self.deadline - time.monotonic()

    def next_timeout(self) -> float:
        """Count a new attempt and give it the request timeout in seconds, cut short by the deadline."""
        self.count += 1
        return max(0.001, min(self.timeout, self.remaining()))

    def next_delay(self, outcome: Outcome) -> float | None:
        """Seconds to wait before the next attempt, or None when `outcome` is final."""
        if self.call.probe:
            return None
        delay = retry_delay(
            self.policy,
            outcome,
            attempt=self.count,
            idempotent=self.call.idempotent,
            remaining=self.remaining(),
        )
        if delay is not None:
            reason = outcome.status if isinstance(outcome, Reply) else type(outcome).__name__
            log.info(
                "%s %s: %s, retry %d in %.2fs", self.call.method, self.call.path, reason, self.count, delay
            )
        return delay

    def finish(self, outcome: Outcome) -> T:
        """Decode the final answer, or turn the final transport failure into `EnvConnectionError`."""
        if isinstance(outcome, Reply):
            return self.call.decode(outcome)
        elapsed = time.monotonic() - self.started
        raise EnvConnectionError(
            f"{self.call.method} {self.url} failed after {self.count} attempt(s) "
            f"in {elapsed:.1f}s: {type(outcome).__name__}: {outcome}"
        ) from outcome


def env_proxy(url: str) -> str | None:
    """The proxy that $HTTP(S)_PROXY / $ALL_PROXY name for `url` unless $NO_PROXY exempts it, as httpx
    reads them. Looked up once per client: aiohttp's own `trust_env` does it in a thread per request."""
    parts = urllib.parse.urlsplit(url)
    proxies = urllib.request.getproxies_environment()
    if not proxies or urllib.request.proxy_bypass(parts.hostname or ""):
        return None
    return proxies.get(parts.scheme) or proxies.get("all")


def _default_headers(token: str | None, headers: Mapping[str, str] | None) -> dict[str, str]:
    """The headers of every request: JSON accepted, the caller's own, and the bearer token."""
    token = os.environ.get(TOKEN_ENV_VAR) if token is None else token
    all_headers = {"accept": "application/json", **(headers or {})}
    if token:
        all_headers["authorization"] = f"Bearer {token}"
    return all_headers


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
        self._http = httpx.Client(headers=_default_headers(token, headers), limits=limits or DEFAULT_LIMITS)

    def reset(
        self,
        *,
        seed: int | None = None,
        task_id: str | None = None,
        sample: Mapping[str, Any] | None = None,
        options: Mapping[str, Any] | None = None,
        session_id: str | None = None,
        format: bool = False,
        timeout: float | None = None,
    ) -> ResetResponse:
        """Start an episode from at most one of `seed`, `task_id` (`SPLIT/INDEX` of a split the server
        holds) and `sample` (a dataset row); returns its session id and first observation."""
        return self._run(reset_call(seed, task_id, sample, options, session_id, format), timeout)

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
        task_id: str | None = None,
        sample: Mapping[str, Any] | None = None,
        options: Mapping[str, Any] | None = None,
        session_id: str | None = None,
        format: bool = False,
    ) -> Iterator[Episode]:
        """Reset, yield an `Episode`, and always close its session on the way out."""
        first = self.reset(
            seed=seed, task_id=task_id, sample=sample, options=options, session_id=session_id, format=format
        )
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
                response = self._http.request(
                    call.method,
                    attempts.url,
                    content=attempts.content,
                    headers=attempts.headers,
                    timeout=attempts.next_timeout(),
                )
                outcome = Reply(
                    response.status_code, response.content, attempts.url, response.headers.get("retry-after")
                )
            except httpx.TransportError as exc:
                outcome = exc
            delay = attempts.next_delay(outcome)
            if delay is None:
                return attempts.finish(outcome)
            time.sleep(delay)


def _aiohttp_timeout(attempts: _Attempts[Any]) -> aiohttp.ClientTimeout:
    """The next attempt's timeouts, split by phase as httpx's are, so that a timeout tells how far it got.

    `connect` (waiting for a free connection, then connecting) raises `ConnectionTimeoutError`: not sent.
    `sock_read` (no bytes for that long) raises `SocketTimeoutError`: maybe applied. `total` is only a
    backstop at the call's deadline; aiohttp reports it as a bare `TimeoutError` whatever the phase.
    """
    per_phase = attempts.next_timeout()
    return aiohttp.ClientTimeout(
        total=max(per_phase, attempts.remaining()), connect=per_phase, sock_read=per_phase
    )


class AsyncEnvClient:
    """The asyncio twin of `EnvClient`: same arguments, same behaviour, awaitable methods.

    It runs on aiohttp, whose cost per request stays flat with hundreds of requests in flight. Of
    `limits` it uses `max_connections` and `keepalive_expiry`. Its connection pool belongs to the
    event loop of its first call; use one client per loop.
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
        self._headers = _default_headers(token, headers)
        self._limits = limits or DEFAULT_LIMITS
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    async def reset(
        self,
        *,
        seed: int | None = None,
        task_id: str | None = None,
        sample: Mapping[str, Any] | None = None,
        options: Mapping[str, Any] | None = None,
        session_id: str | None = None,
        format: bool = False,
        timeout: float | None = None,
    ) -> ResetResponse:
        """Start an episode from at most one of `seed`, `task_id` (`SPLIT/INDEX` of a split the server
        holds) and `sample` (a dataset row); returns its session id and first observation."""
        return await self._run(reset_call(seed, task_id, sample, options, session_id, format), timeout)

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
        task_id: str | None = None,
        sample: Mapping[str, Any] | None = None,
        options: Mapping[str, Any] | None = None,
        session_id: str | None = None,
        format: bool = False,
    ) -> AsyncIterator[AsyncEpisode]:
        """Reset, yield an `AsyncEpisode`, and always close its session on the way out."""
        first = await self.reset(
            seed=seed, task_id=task_id, sample=sample, options=options, session_id=session_id, format=format
        )
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
        self._closed = True
        if self._session is not None:
            await self._session.close()

    async def __aenter__(self) -> AsyncEnvClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    async def _run(self, call: Call[T], timeout: float | None) -> T:
        """Send `call` with bounded retries and decode the final outcome."""
        session = self._open_session()
        attempts = _Attempts(call, self.retry, timeout or self.timeout, self.base_url)
        while True:
            outcome: Outcome
            try:
                async with session.request(
                    call.method,
                    attempts.url,
                    data=attempts.content,
                    headers=attempts.headers,
                    timeout=_aiohttp_timeout(attempts),
                    allow_redirects=False,
                ) as response:
                    body = await response.read()
                outcome = Reply(response.status, body, attempts.url, response.headers.get("retry-after"))
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                outcome = exc
            delay = attempts.next_delay(outcome)
            if delay is None:
                return attempts.finish(outcome)
            await asyncio.sleep(delay)

    def _open_session(self) -> aiohttp.ClientSession:
        """The connection pool, made on first use because aiohttp ties it to the running event loop."""
        loop = asyncio.get_running_loop()
        if self._closed:
            raise RuntimeError("this AsyncEnvClient is shut down")
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=self._limits.max_connections or 0, keepalive_timeout=self._limits.keepalive_expiry
            )
            self._session = aiohttp.ClientSession(
                connector=connector, headers=self._headers, proxy=env_proxy(self.base_url)
            )
            self._loop = loop
        elif loop is not self._loop:
            raise RuntimeError("an AsyncEnvClient serves the event loop of its first call; make one per loop")
        return self._session


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
