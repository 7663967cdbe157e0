"""HTTP clients for environment servers: `AsyncEnvClient` (asyncio, on aiohttp, whose connection pool stays
cheap with hundreds of concurrent requests) and `EnvClient`, its blocking, thread-safe facade (see
docs/client.md).

Every API call is first described as a `vistarl.clients.calls.Call` (request, retry safety, decoder) and then
sent by `AsyncEnvClient._send` in the retry loop that every caller shares (`vistarl.clients.retry`, which also
decides whether and when to retry). `EnvClient` runs the same coroutines on an event loop of its own
(`vistarl.clients.blocking`), so the two clients share every rule and differ only in how the caller waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any, Generic, TypedDict, TypeVar

import aiohttp
import httpx
from anyio.from_thread import BlockingPortal, start_blocking_portal
from typing_extensions import Unpack

from vistarl.clients.blocking import blocking, blocking_context, mirrored
from vistarl.clients.calls import (
    HEALTH_CALL,
    INFO_CALL,
    READY_CALL,
    Call,
    Outcome,
    Reply,
    close_call,
    format_call,
    reset_call,
    step_call,
)
from vistarl.clients.errors import EnvClientError, EnvConnectionError
from vistarl.clients.pool import LoopPool
from vistarl.clients.protocol import (
    HealthResponse,
    InfoResponse,
    Message,
    Observation,
    ReadyResponse,
    ResetResponse,
    StepResponse,
    ToolCall,
)
from vistarl.clients.replicas import Replicas
from vistarl.clients.retry import (
    Delivery,
    RetryPolicy,
    attempt_until_final,
    delivery,
    fails_over,
    retry_after_seconds,
    retry_delay,
)

__all__ = [
    "DEFAULT_LIMITS",
    "TOKEN_ENV_VAR",
    "AsyncEnvClient",
    "AsyncEpisode",
    "Delivery",
    "EnvClient",
    "Episode",
    "Reply",
    "RetryPolicy",
    "delivery",
    "env_proxy",
    "retry_after_seconds",
    "retry_delay",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

TOKEN_ENV_VAR = "VISTARL_API_TOKEN"
DEFAULT_TIMEOUT_S = 30.0
DEFAULT_LIMITS = httpx.Limits(max_connections=512, max_keepalive_connections=128, keepalive_expiry=4.0)
_JSON_CONTENT = {"content-type": "application/json"}


class _Attempts(Generic[T]):
    """The bookkeeping of one call's attempts: its body, the replica, the per-attempt timeout, the
    deadline, the delay."""

    def __init__(self, call: Call[T], policy: RetryPolicy, timeout: float, replicas: Replicas) -> None:
        self.call = call
        self.policy = policy
        self.timeout = timeout
        self.replicas = replicas
        self.replica = replicas.first(call.session_id)
        self.tried = {self.replica}
        self.content = call.content()
        self.headers = None if self.content is None else _JSON_CONTENT
        self.started = time.monotonic()
        self.deadline = self.started + policy.deadline_s
        self.count = 0

    @property
    def url(self) -> str:
        """The URL of the next attempt, on its replica."""
        return self.replicas.urls[self.replica] + self.call.path

    def remaining(self) -> float:
        """Seconds left before the call's deadline."""
        return self.deadline - time.monotonic()

    def next_timeout(self) -> float:
        """Count a new attempt and give it the request timeout in seconds, cut short by the deadline."""
        self.count += 1
        return max(0.001, min(self.timeout, self.remaining()))

    def next_delay(self, outcome: Outcome) -> float | None:
        """Seconds to wait before the next attempt, or None when `outcome` is final. A replica that could
        not serve the call passes it to the next (docs/client.md, "Several replicas")."""
        if self.call.probe:
            return None
        leaving = len(self.replicas.urls) > 1 and fails_over(outcome)
        following = self.replicas.after(self.replica) if leaving else self.replica
        delay = retry_delay(
            self.policy,
            outcome,
            attempt=self.count,
            idempotent=self.call.idempotent,
            remaining=self.remaining(),
            fresh_replica=following not in self.tried,
        )
        if delay is not None:
            self.replica = following
            self.tried.add(following)
            reason = outcome.status if isinstance(outcome, Reply) else type(outcome).__name__
            log.info(
                "%s %s: %s, retry %d in %.2fs at %s",
                *(self.call.method, self.call.path, reason, self.count, delay, self.replicas.urls[following]),
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


class ClientOptions(TypedDict, total=False):
    """The keyword arguments of `AsyncEnvClient`, and so of `EnvClient`; their defaults are there."""

    token: str | None
    timeout: float
    retry: RetryPolicy | None
    limits: httpx.Limits | None
    headers: Mapping[str, str] | None


class EpisodeStart(TypedDict, total=False):
    """The arguments of `AsyncEnvClient.reset` that `episode()` passes on: the task and the session id."""

    seed: int | None
    task_id: str | None
    sample: Mapping[str, Any] | None
    options: Mapping[str, Any] | None
    session_id: str | None


class AsyncEnvClient:
    """An asyncio client for an environment server; `EnvClient` is its blocking facade.

    `base_url` is one URL, or the URLs of several replicas to fail over between (`vistarl.clients.replicas`).
    `token` defaults to $VISTARL_API_TOKEN (pass "" for none). `timeout` is per attempt; `retry`
    bounds attempts and total time per call. It runs on aiohttp, whose cost per request stays flat
    with hundreds of requests in flight; of `limits` it uses `max_connections` and `keepalive_expiry`.
    Its connection pool belongs to the event loop of its first call; use one client per loop.
    """

    def __init__(
        self,
        base_url: str | Sequence[str],
        *,
        token: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        retry: RetryPolicy | None = None,
        limits: httpx.Limits | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self._replicas = Replicas([base_url] if isinstance(base_url, str) else base_url)
        self._proxies = [env_proxy(url) for url in self._replicas.urls]
        self.base_urls = self._replicas.urls
        self.base_url = self.base_urls[0]
        self.timeout = timeout
        self.retry = retry or RetryPolicy()
        limits = limits or DEFAULT_LIMITS
        self._pool = LoopPool(
            "AsyncEnvClient",
            max_connections=limits.max_connections or 0,
            keepalive_s=limits.keepalive_expiry,
            headers=_default_headers(token, headers),
        )

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
        attempts = self._attempts(reset_call(seed, task_id, sample, options, session_id, format), timeout)
        first = await self._send(attempts)
        self._replicas.settle(first.session_id, attempts.replica)
        return first

    async def step(
        self,
        session_id: str,
        action: str | ToolCall,
        *,
        request_id: str | None = None,
        format: bool = False,
        timeout: float | None = None,
    ) -> StepResponse:
        """Send one turn: the response text, or a `ToolCall` of the env's tools (the server steps with the
        text it stands for); resent safely on a lost response because it carries a request_id."""
        return await self._run(step_call(session_id, action, request_id, format), timeout)

    async def format(
        self, observation: Observation | Mapping[str, Any], *, timeout: float | None = None
    ) -> Message:
        """The environment's chat message for an observation."""
        return await self._run(format_call(observation), timeout)

    async def close(self, session_id: str, *, timeout: float | None = None) -> bool:
        """End a session; True if it was deleted, False if it was already gone."""
        closed = await self._run(close_call(session_id), timeout)
        self._replicas.forget(session_id)
        return closed

    async def info(self, *, timeout: float | None = None) -> InfoResponse:
        """The environment's name, prompts, options schema and limits."""
        return await self._run(INFO_CALL, timeout)

    async def health(self, *, timeout: float | None = None) -> HealthResponse:
        """Liveness, tried once."""
        return await self._run(HEALTH_CALL, timeout)

    async def ready(self, *, timeout: float | None = None) -> ReadyResponse:
        """Readiness, tried once: `ready` is False while the server drains or is full (it answers 503
        with the same object)."""
        return await self._run(READY_CALL, timeout)

    @contextlib.asynccontextmanager
    async def episode(
        self, *, format: bool = False, **start: Unpack[EpisodeStart]
    ) -> AsyncIterator[AsyncEpisode]:
        """Reset (with `reset`'s task and session arguments), yield an `AsyncEpisode`, and always close its
        session on the way out."""
        first = await self.reset(format=format, **start)
        ep = AsyncEpisode(self, first, format)
        try:
            yield ep
        except BaseException:
            with _logging_close_errors(ep.session_id):
                await ep.close()
            raise
        await ep.close()

    @property
    def closed(self) -> bool:
        """Whether `shutdown` ran."""
        return self._pool.closed

    async def shutdown(self) -> None:
        """Close the connection pool."""
        await self._pool.close()

    async def __aenter__(self) -> AsyncEnvClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    async def _run(self, call: Call[T], timeout: float | None) -> T:
        """Send `call` with bounded retries and decode the final outcome."""
        return await self._send(self._attempts(call, timeout))

    def _attempts(self, call: Call[T], timeout: float | None) -> _Attempts[T]:
        return _Attempts(call, self.retry, timeout or self.timeout, self._replicas)

    async def _send(self, attempts: _Attempts[T]) -> T:
        """Run the attempts of one call until one is final; a session's call that succeeded tells on which
        replica the session lives."""
        session = self._pool.session()
        call = attempts.call

        async def attempt() -> Outcome:
            try:
                async with session.request(
                    call.method,
                    attempts.url,
                    data=attempts.content,
                    headers=attempts.headers,
                    timeout=_aiohttp_timeout(attempts),
                    proxy=self._proxies[attempts.replica],
                    allow_redirects=False,
                ) as response:
                    body = await response.read()
                return Reply(response.status, body, attempts.url, response.headers.get("retry-after"))
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                return exc

        outcome, _ = await attempt_until_final(attempt, lambda outcome, _: attempts.next_delay(outcome))
        result = attempts.finish(outcome)
        if call.session_id is not None:
            self._replicas.settle(call.session_id, attempts.replica)
        return result


class AsyncEpisode:
    """A live episode of an `AsyncEnvClient`: its latest observation, rewards so far, and `await step()`."""

    def __init__(self, client: AsyncEnvClient, first: ResetResponse, format: bool) -> None:
        self._client = client
        self.session_id = first.session_id
        self.observation = first.observation
        self.info = first.info
        self.message = first.message
        self.format = format
        self.reward = 0.0
        self.total_reward = 0.0
        self.done = False
        self.truncated = False
        self.turns = 0

    async def step(
        self, action: str | ToolCall, *, request_id: str | None = None, timeout: float | None = None
    ) -> StepResponse:
        """Send one turn (the response text, or a `ToolCall`) and record its result."""
        result = await self._client.step(
            self.session_id, action, request_id=request_id, format=self.format, timeout=timeout
        )
        self.observation = result.observation
        self.info = result.info
        self.message = result.message
        self.reward = result.reward
        self.total_reward += result.reward
        self.done = result.done
        self.truncated = result.truncated
        self.turns += 1
        return result

    async def close(self) -> bool:
        """End the session (False if it was already gone)."""
        return await self._client.close(self.session_id)


class Episode:
    """A live episode of an `EnvClient`: its latest observation, rewards so far, and `step()`; the
    blocking face of an `AsyncEpisode`."""

    session_id = mirrored[str]()
    observation = mirrored[Observation]()
    info = mirrored[dict[str, Any]]()
    message = mirrored[Message | None]()
    format = mirrored[bool]()
    reward = mirrored[float]()
    total_reward = mirrored[float]()
    done = mirrored[bool]()
    truncated = mirrored[bool]()
    turns = mirrored[int]()

    def __init__(self, portal: BlockingPortal, episode: AsyncEpisode) -> None:
        self._portal = portal
        self._target = episode

    step = blocking(AsyncEpisode.step)
    close = blocking(AsyncEpisode.close)


class EnvClient:
    """A blocking client for an environment server: thread-safe, with one shared connection pool.

    It takes `AsyncEnvClient`'s arguments (`ClientOptions`, defaults there) and runs one on an event loop
    of its own, on a daemon thread:
    calls from many threads run concurrently there. Use it as a context manager, or call `shutdown()`,
    which closes the pool and stops the thread.
    """

    base_url = mirrored[str]()
    base_urls = mirrored[tuple[str, ...]]()
    timeout = mirrored[float]()
    retry = mirrored[RetryPolicy]()

    def __init__(self, base_url: str | Sequence[str], **options: Unpack[ClientOptions]) -> None:
        self._target = AsyncEnvClient(base_url, **options)
        self._loop_thread = contextlib.ExitStack()
        self._portal = self._loop_thread.enter_context(start_blocking_portal(name="vistarl-env-client"))

    reset = blocking(AsyncEnvClient.reset)
    step = blocking(AsyncEnvClient.step)
    format = blocking(AsyncEnvClient.format)
    close = blocking(AsyncEnvClient.close)
    info = blocking(AsyncEnvClient.info)
    health = blocking(AsyncEnvClient.health)
    ready = blocking(AsyncEnvClient.ready)
    episode = blocking_context(AsyncEnvClient.episode, Episode)

    def shutdown(self) -> None:
        """Close the connection pool and stop the event-loop thread; later calls raise RuntimeError."""
        if not self._target.closed:
            self._portal.call(self._target.shutdown)
            self._loop_thread.close()

    def __enter__(self) -> EnvClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
