"""The retry rules of the env clients: which failures are worth another attempt, and when.

Pure functions of a library-neutral `Reply` or of the transport exception (aiohttp's, or httpx's for the
callers that still send with httpx), so that every client decides the same way; docs/client.md,
"Timeouts, retries, auth", states the rules.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import enum
import random
from dataclasses import dataclass, field
from datetime import datetime, timezone

import aiohttp
import httpx

from clients.calls import Outcome, Reply

__all__ = ["Delivery", "RetryPolicy", "delivery", "fails_over", "retry_after_seconds", "retry_delay"]

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
    policy: RetryPolicy,
    outcome: Outcome,
    *,
    attempt: int,
    idempotent: bool,
    remaining: float,
    fresh_replica: bool = False,
) -> float | None:
    """Seconds to wait before retrying after `outcome` of attempt number `attempt`, or None to stop.

    Retries busy statuses (honouring Retry-After) and unsent requests always; lost responses only
    when the call is idempotent. Never schedules a retry that would start past the deadline. A retry
    on a replica that this call has not tried yet (`fresh_replica`) goes at once.
    """
    if attempt >= policy.max_attempts or remaining <= 0:
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
    if fresh_replica:
        return 0.0
    return delay if delay < remaining else None


def fails_over(outcome: Outcome) -> bool:
    """Whether `outcome` says that this replica cannot serve the call now (it could not be reached, or it
    answered 503), so that another replica should be tried."""
    if isinstance(outcome, Reply):
        return outcome.status == 503
    return delivery(outcome) is Delivery.NOT_SENT
