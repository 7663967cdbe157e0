"""The project's one retry policy: which failures are worth another attempt, when, and the loop that waits.

`RetryPolicy` bounds every retry (attempts, backoff, deadline). `retry_delay` decides for an HTTP call,
from a library-neutral `Reply` or aiohttp's transport exception (every client sends with aiohttp,
`vistarl.clients.pool`), so that every client decides the same way; docs/client.md, "Timeouts,
retries, auth", states the rules. `attempt_until_final` is the loop that the env client, the SGLang engine
and the queue worker all run their attempts in.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import enum
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TypeVar

import aiohttp

from vistarl.clients.calls import Outcome, Reply

__all__ = [
    "Delivery",
    "RetryPolicy",
    "attempt_until_final",
    "delivery",
    "fails_over",
    "retry_after_seconds",
    "retry_delay",
]

OutcomeT = TypeVar("OutcomeT")

OUTAGE_ATTEMPTS = 1_000_000
"""`max_attempts` of `RetryPolicy.outage`: more than any deadline allows, so that the deadline bounds it."""

# Failures before the request reached the server (no connection, or none free in time).
_NOT_SENT: tuple[type[Exception], ...] = (
    aiohttp.ConnectionTimeoutError,  # connect or pool wait; a subclass of TimeoutError, so listed first
    aiohttp.ClientConnectorError,  # DNS, refused, TLS handshake
)
# Failures after the request was (maybe partly) sent: the server may have acted on it.
_MAYBE_APPLIED: tuple[type[Exception], ...] = (
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
    """Classify an aiohttp transport exception by how far its request went."""
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
        # Past 64 doublings the cap holds anyway, and 2**attempt would overflow a float.
        doublings = min(attempt - 1, 64)
        return random.uniform(0, min(self.max_delay, self.base_delay * 2**doublings))

    @classmethod
    def outage(cls, deadline_s: float, base_delay: float = 0.1, max_delay: float = 2.0) -> RetryPolicy:
        """A policy that its deadline alone bounds: for waiting out an outage of up to `deadline_s`
        seconds (an env server, the engine, the queue), however many attempts that takes."""
        return cls(
            max_attempts=OUTAGE_ATTEMPTS, base_delay=base_delay, max_delay=max_delay, deadline_s=deadline_s
        )

    def spent(self, attempt: int, remaining: float) -> bool:
        """Whether attempt number `attempt` was the last one allowed, by count or by the time left."""
        return attempt >= self.max_attempts or remaining <= 0

    def backoff(self, attempt: int, remaining: float, retry_after: float | None = None) -> float | None:
        """The wait before the attempt after number `attempt`, or None when the attempts or the time are
        spent: a retry never starts past the deadline (`remaining` seconds from now)."""
        if self.spent(attempt, remaining):
            return None
        delay = self.delay(attempt, retry_after)
        return delay if delay < remaining else None


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
    if isinstance(outcome, Reply):
        if outcome.status not in policy.retry_statuses:
            return None
        retry_after = retry_after_seconds(outcome.retry_after)
    else:
        sent = delivery(outcome)
        if not (sent is Delivery.NOT_SENT or (idempotent and sent is Delivery.MAYBE_APPLIED)):
            return None
        retry_after = None
    if fresh_replica:
        return None if policy.spent(attempt, remaining) else 0.0
    return policy.backoff(attempt, remaining, retry_after)


async def attempt_until_final(
    attempt: Callable[[], Awaitable[OutcomeT]], next_delay: Callable[[OutcomeT, int], float | None]
) -> tuple[OutcomeT, int]:
    """Run `attempt()` until `next_delay(outcome, attempts so far)` says the outcome is final (None),
    sleeping the delay it gives between attempts; the final outcome and the number of attempts.

    The loop of every retrying caller: the bounds live in `next_delay` (a `RetryPolicy` underneath, which
    also logs why it retries), so this ends as soon as that policy does.
    """
    count = 0
    while True:
        count += 1
        outcome = await attempt()
        delay = next_delay(outcome, count)
        if delay is None:
            return outcome, count
        await asyncio.sleep(delay)


def fails_over(outcome: Outcome) -> bool:
    """Whether `outcome` says that this replica cannot serve the call now (it could not be reached, or it
    answered 503), so that another replica should be tried."""
    if isinstance(outcome, Reply):
        return outcome.status == 503
    return delivery(outcome) is Delivery.NOT_SENT
