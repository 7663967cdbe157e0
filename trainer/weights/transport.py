"""What a transport is, and what the three share.

A `Transport` lives on trainer rank 0 and runs on the trainer's compute thread (where every collective
runs): it takes the buckets that `buckets.gathered_buckets` gathers and makes the engine serve them as
one weight version. The engine's own calls are coroutines of the event loop the engine lives on;
`EngineCalls` runs them there from the compute thread, each wait bounded. `pipelined` keeps one bucket
in flight to the engine while the next one is gathered.

Engines name the transports they take (`weight_transports`, of `TransportKind`): `in_process` for an
engine in the trainer's process, `disk` and `nccl` for servers. An engine pool (`PushTargets`) names the
servers one push reaches: the disk and NCCL transports send each push once to all of them (one
checkpoint directory, one broadcast), or to those a reconnection names (`Transport.reconnect`: one that
died is left out until it serves again).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
from collections.abc import Callable, Coroutine, Iterable, Iterator, Sequence
from typing import Any, Literal, Protocol, TypeVar, runtime_checkable

from vistarl.trainer.rollout.engines.sglang_api import PauseMode
from vistarl.trainer.weights.buckets import Bucket

__all__ = [
    "EngineCalls",
    "PausableEngine",
    "PushTargets",
    "Transport",
    "TransportKind",
    "Waiter",
    "paused",
    "pipelined",
    "push_targets",
]

TransportKind = Literal["in_process", "disk", "nccl"]
T = TypeVar("T")
Waiter = Callable[[], None]
"""Waits until a bucket sent to the engine is loaded there."""


class Transport(Protocol):
    """Rank 0's side of a push (see the module docstring)."""

    def push(self, buckets: Iterable[Bucket], version: int) -> None:
        """Make the engine serve these buckets as `str(version)`; consumes every bucket."""
        ...

    def reconnect(self, engines: Sequence[int] | None) -> None:
        """Drop the connection: the next push forms it afresh, to these of the engine's push targets
        (indices; None: all of them)."""
        ...

    def close(self) -> None:
        """Release what the transport holds (process groups); the engine keeps its weights. A push after
        it connects again."""
        ...


@runtime_checkable
class PushTargets(Protocol):
    """Several engines that one push reaches (an engine pool's servers)."""

    @property
    def push_targets(self) -> Sequence[object]:
        """The engines, in the order the indices of `Transport.reconnect` count them."""
        ...


def push_targets(engine: object) -> list[object]:
    """The engines a push to `engine` reaches: a pool's push targets, else the engine itself."""
    return list(engine.push_targets) if isinstance(engine, PushTargets) else [engine]


class EngineCalls:
    """Runs the engine's coroutines on its event loop from another thread, each wait bounded."""

    def __init__(self, loop: asyncio.AbstractEventLoop, timeout_s: float) -> None:
        self.loop = loop
        self.timeout_s = timeout_s

    def start(self, call: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start `call` on the engine's loop; the future's `result` waits for it."""
        return asyncio.run_coroutine_threadsafe(call, self.loop)

    def wait(self, future: concurrent.futures.Future[T]) -> T:
        """The result of a started call, within the timeout (a `TimeoutError` after it)."""
        try:
            return future.result(self.timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"the engine did not answer within {self.timeout_s:g} s") from None

    def __call__(self, call: Coroutine[Any, Any, T]) -> T:
        """Run `call` on the engine's loop and wait for its result."""
        return self.wait(self.start(call))

    def each(self, calls: Iterable[Coroutine[Any, Any, T]]) -> list[T]:
        """Start every call, then wait for each result in order (all of them run at once)."""
        return [self.wait(future) for future in [self.start(call) for call in calls]]


def pipelined(buckets: Iterable[Bucket], send: Callable[[Bucket], Waiter]) -> None:
    """Send every bucket, one in flight at a time: bucket k+1 is gathered while bucket k travels, and is
    sent once bucket k has been loaded (engines take buckets in order)."""
    in_flight: Waiter | None = None
    for bucket in buckets:
        if in_flight is not None:
            in_flight()
        in_flight = send(bucket)
    if in_flight is not None:
        in_flight()


@runtime_checkable
class PausableEngine(Protocol):
    """An engine whose generation can be held around a weight update."""

    async def pause_generation(self, mode: PauseMode = "abort") -> None:
        """Start no new batch until `continue_generation`."""
        ...

    async def continue_generation(self) -> None:
        """Resume after `pause_generation`."""
        ...


@contextlib.contextmanager
def paused(calls: EngineCalls, engines: Sequence[PausableEngine], pause: bool) -> Iterator[None]:
    """With `pause`, hold the engines' generation for the block (`retract`: requests in flight resume on
    the new weights), then resume it; each call goes to every engine at once."""
    if not pause:
        yield
        return
    calls.each(engine.pause_generation("retract") for engine in engines)
    try:
        yield
    finally:
        calls.each(engine.continue_generation() for engine in engines)
