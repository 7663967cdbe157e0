"""Rollout workers: take episode jobs from the queue, run them with an episode runner, publish trajectories.

A worker holds at most `concurrency` jobs and takes at most `take_max` per read, so the jobs of one
step spread over the workers that wait for them. Every `lease_s / 3` it heartbeats (which keeps it
counted as alive, and renews the leases of its jobs); it reclaims the jobs of workers that stopped
heartbeating, and publishes finished trajectories in batches (publish and ack in one atomic call).
On shutdown it stops taking jobs, gives running episodes a grace period, and hands the rest back to
the queue without counting a failed attempt.

What an episode *is* belongs to the runner: any `async (EpisodeJob) -> Trajectory`, built by a factory
that receives the `WorkerOptions` (`vistarl worker` passes `vistarl.trainer.queue.episode_runner`'s unless
`--runner module:function` names another).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import os
import random
import socket
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar, cast

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from pydantic import BaseModel, ConfigDict, Field

from vistarl.clients.retry import RetryPolicy, attempt_until_final
from vistarl.trainer.imports import load_callable
from vistarl.trainer.queue import open_queue
from vistarl.trainer.queue.base import NAMESPACE_PATTERN, Delivery, EpisodeQueue, QueueUnavailable, entry_time
from vistarl.trainer.rollout.engines.spec import EngineSpec
from vistarl.trainer.rollout.job import EpisodeJob
from vistarl.trainer.rollout.trajectory import Trajectory

__all__ = [
    "EpisodeRunner",
    "RunnerFactory",
    "Worker",
    "WorkerMetrics",
    "WorkerOptions",
    "load_runner_factory",
    "pack_result",
    "run_worker",
]

log = logging.getLogger(__name__)

T = TypeVar("T")


class EpisodeRunner(Protocol):
    """Runs one episode. Returning a trajectory (even FAILED/ABORTED) delivers it; raising fails the attempt.

    A runner may also define `async aclose()`, which the worker awaits once at shutdown.
    """

    async def __call__(self, job: EpisodeJob, /) -> Trajectory: ...


def default_take_max(concurrency: int) -> int:
    """Jobs taken per read by default: a quarter of the slots, so a step's jobs reach several workers
    while reads stay batched (docs/queue.md, "The life of a job")."""
    return max(1, concurrency // 4)


def default_consumer_name() -> str:
    """A worker's name in the consumer group: host and process id, unique among live workers."""
    return f"{socket.gethostname()}-{os.getpid()}"


class WorkerOptions(BaseModel):
    """Everything `vistarl worker` takes; runner factories receive it whole."""

    model_config = ConfigDict(extra="forbid")

    redis_url: str | None = None
    namespace: str = Field(default="default", pattern=NAMESPACE_PATTERN)
    engine: EngineSpec | None = None
    tokenizer: Path | None = Field(
        default=None, description="with an engine server: the local checkpoint to load the processor from"
    )
    env_urls: dict[str, str] = Field(default_factory=dict, description="env name -> server URL")
    reward_path: str | None = Field(default=None, description="episode reward function, module[:function]")
    runner: str | None = Field(default=None, description="runner factory module:function; None: the default")
    concurrency: int = Field(default=8, ge=1)
    take_max: int | None = Field(default=None, ge=1, description="jobs per read; None: concurrency // 4")
    lease_s: float = Field(default=30.0, gt=0)
    max_attempts: int = Field(default=3, ge=1)
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    consumer: str = Field(default_factory=default_consumer_name, min_length=1)
    shutdown_grace_s: float = Field(default=30.0, ge=0)
    max_outage_s: float = Field(default=120.0, gt=0, description="give up after the queue is down this long")


RunnerFactory = Callable[[WorkerOptions], EpisodeRunner]


def load_runner_factory(path: str) -> RunnerFactory:
    """Import a runner factory given as `module:function`."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"runner {path!r} must be given as module:function")
    return cast(RunnerFactory, load_callable(module_name, attr, "runner"))


class WorkerMetrics:
    """A worker's Prometheus metrics, in a registry of their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.done = Counter(
            "vistarl_worker_episodes_done", "Episodes whose trajectory was published", registry=r
        )
        self.failed = Counter("vistarl_worker_episodes_failed", "Episode attempts that raised", registry=r)
        self.dead_lettered = Counter(
            "vistarl_worker_episodes_dead_lettered",
            "Jobs moved to the dead letters after their last attempt",
            registry=r,
        )
        self.reclaimed = Counter(
            "vistarl_worker_episodes_reclaimed",
            "Jobs taken over from workers that stopped heartbeating",
            registry=r,
        )
        self.released = Counter(
            "vistarl_worker_episodes_released", "Unfinished jobs handed back at shutdown", registry=r
        )
        self.lost = Counter(
            "vistarl_worker_episodes_lost",
            "Running episodes cancelled because their lease was lost",
            registry=r,
        )
        self.latency = Histogram(
            "vistarl_worker_episode_seconds",
            "Wall time of one episode attempt",
            buckets=(0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600),
            registry=r,
        )
        self.queue_lag = Gauge(
            "vistarl_worker_queue_lag_seconds",
            "How long the last job taken had waited in the queue",
            registry=r,
        )
        self.running = Gauge("vistarl_worker_running_episodes", "Episodes running now", registry=r)


@dataclass(frozen=True)
class _Outcome:
    """A finished attempt waiting to be written: a packed trajectory, or the error that failed it."""

    delivery: Delivery
    payload: bytes | None
    error: str | None


class Worker:
    """Consume jobs from `queue` with `runner`, holding at most `concurrency` of them, until told to stop."""

    def __init__(
        self,
        queue: EpisodeQueue,
        runner: EpisodeRunner,
        *,
        consumer: str | None = None,
        concurrency: int = 8,
        take_max: int | None = None,
        shutdown_grace_s: float = 30.0,
        max_outage_s: float = 120.0,
        metrics: WorkerMetrics | None = None,
        block_s: float = 0.5,
        max_batch: int = 512,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        self.queue = queue
        self.runner = runner
        self.consumer = consumer or default_consumer_name()
        self.concurrency = concurrency
        self.take_max = take_max or default_take_max(concurrency)
        self.shutdown_grace_s = shutdown_grace_s
        self.max_outage_s = max_outage_s
        self.metrics = metrics or WorkerMetrics()
        self.block_s = block_s
        self.max_batch = max_batch
        self._held: dict[str, Delivery] = {}
        self._running: dict[str, asyncio.Task[None]] = {}
        self._outcomes: asyncio.Queue[_Outcome] = asyncio.Queue()
        self._slot_freed = asyncio.Event()
        self._background: list[asyncio.Task[None]] = []
        self.metrics.running.set_function(lambda: len(self._running))

    async def run(self, stop: asyncio.Event) -> None:
        """Work until `stop` is set, then drain and leave the group; raises if the queue stays unreachable
        past `max_outage_s`."""
        self._background = [
            asyncio.create_task(self._heartbeat_loop()),
            asyncio.create_task(self._reclaim_loop()),
            asyncio.create_task(self._publish_loop()),
        ]
        try:
            await self._watching(self._consume(stop))
            await self._watching(self._drain())
        finally:
            await _cancel([*self._background, *self._running.values()])
        with contextlib.suppress(QueueUnavailable):  # after the last heartbeat, which would revive it
            await self.queue.forget_consumer(self.consumer)

    async def _consume(self, stop: asyncio.Event) -> None:
        """Take jobs, at most `take_max` at a time, while there is room and `stop` is not set."""
        while not stop.is_set():
            free = self.concurrency - len(self._held)
            if free <= 0:
                self._slot_freed.clear()
                await _first_of(stop.wait(), self._slot_freed.wait())
                continue
            count = min(free, self.take_max)
            take = functools.partial(self.queue.take, self.consumer, count, self.block_s)
            for delivery in await self._retrying(take):
                self._start(delivery)

    def _start(self, delivery: Delivery) -> None:
        self._held[delivery.entry_id] = delivery
        waited = max(0.0, time.time() - entry_time(delivery.entry_id))
        self.metrics.queue_lag.set(waited)
        self._running[delivery.entry_id] = asyncio.create_task(self._run_episode(delivery, waited))

    async def _run_episode(self, delivery: Delivery, waited: float) -> None:
        """Run one attempt and queue its outcome for the publisher; a cancelled attempt leaves no outcome.
        `waited`: the seconds the job spent in the queue, kept in the trajectory's timings as `queue`."""
        job = delivery.job
        started = time.perf_counter()
        try:
            outcome = _Outcome(delivery, pack_result(job, await self.runner(job), queued_s=waited), None)
        except Exception as exc:
            log.warning("episode %s attempt %d failed", job.episode_id, job.attempt, exc_info=True)
            outcome = _Outcome(delivery, None, f"{type(exc).__name__}: {exc} [worker {self.consumer}]")
        finally:
            self._running.pop(delivery.entry_id, None)
        self.metrics.latency.observe(time.perf_counter() - started)
        self._outcomes.put_nowait(outcome)

    async def _publish_loop(self) -> None:
        """Write outcomes in batches: trajectories published and acked together, failures retried/buried."""
        while True:
            batch = [await self._outcomes.get()]
            while len(batch) < self.max_batch and not self._outcomes.empty():
                batch.append(self._outcomes.get_nowait())
            done = [(o.delivery, o.payload) for o in batch if o.payload is not None]
            if done:
                await self._retrying(functools.partial(self.queue.complete, done))
                self.metrics.done.inc(len(done))
            for outcome in batch:
                if outcome.error is not None:
                    fail = functools.partial(self.queue.fail, outcome.delivery, outcome.error)
                    self.metrics.failed.inc()
                    if await self._retrying(fail):
                        self.metrics.dead_lettered.inc()
            for outcome in batch:
                self._held.pop(outcome.delivery.entry_id, None)
                self._outcomes.task_done()
            self._slot_freed.set()

    async def _heartbeat_loop(self) -> None:
        """Heartbeat from the start and every `lease_s / 3`, idle or not; cancel running episodes whose
        lease was lost."""
        while True:
            held = list(self._held)
            try:
                kept = await self.queue.heartbeat(self.consumer, held)
            except QueueUnavailable as exc:
                log.warning("heartbeat failed: %s", exc)
                kept = set(held)  # a lease is lost only when the queue says so
            for entry_id in set(held) - kept:
                task = self._running.pop(entry_id, None)
                if task is not None:
                    log.warning("lost the lease on %s; cancelling its episode", entry_id)
                    task.cancel()
                    self._held.pop(entry_id, None)
                    self.metrics.lost.inc()
                    self._slot_freed.set()
            await asyncio.sleep(self.queue.lease_s / 3)

    async def _reclaim_loop(self) -> None:
        """Every half lease (jittered), take over and retry the jobs of workers that stopped heartbeating."""
        while True:
            await asyncio.sleep(self.queue.lease_s / 2 * random.uniform(0.8, 1.2))
            try:
                taken = await self.queue.reclaim(self.consumer)
            except QueueUnavailable as exc:
                log.warning("reclaim failed: %s", exc)
                continue
            if taken:
                self.metrics.reclaimed.inc(sum(taken.values()))
                owners = ", ".join(f"{count} from {owner}" for owner, count in sorted(taken.items()))
                log.info("reclaimed the jobs of workers that stopped heartbeating: %s", owners)

    async def _drain(self) -> None:
        """Give running episodes `shutdown_grace_s`, hand the unfinished back, and publish what finished."""
        running = dict(self._running)
        if running:
            await asyncio.wait(running.values(), timeout=self.shutdown_grace_s)
        unfinished = {entry_id: task for entry_id, task in running.items() if not task.done()}
        await _cancel(list(unfinished.values()))
        released = [
            delivery
            for entry_id, task in unfinished.items()
            if task.cancelled() and (delivery := self._held.pop(entry_id, None)) is not None
        ]
        if released:
            log.info("handing back %d unfinished episodes", len(released))
            await self._retrying(functools.partial(self.queue.release, released))
            self.metrics.released.inc(len(released))
        await self._outcomes.join()

    async def _watching(self, work: Coroutine[Any, Any, None]) -> None:
        """Run `work`, but stop at once with the error of any background loop that died."""
        task = asyncio.create_task(work)
        try:
            await asyncio.wait([task, *self._background], return_when=asyncio.FIRST_COMPLETED)
            for loop in self._background:
                if loop.done():
                    loop.result()
                    raise RuntimeError(f"worker loop {loop.get_coro()!r} stopped unexpectedly")
            await task
        finally:
            await _cancel([task])

    async def _retrying(self, operation: Callable[[], Awaitable[T]]) -> T:
        """Run a queue operation, retrying with the shared policy's capped, jittered backoff through
        outages of up to `max_outage_s`; the last `QueueUnavailable` is raised after that."""
        policy = RetryPolicy.outage(self.max_outage_s)
        deadline = time.monotonic() + policy.deadline_s

        async def attempt() -> T | QueueUnavailable:
            try:
                return await operation()
            except QueueUnavailable as exc:
                return exc

        def next_delay(outcome: T | QueueUnavailable, attempts: int) -> float | None:
            if not isinstance(outcome, QueueUnavailable):
                return None
            delay = policy.backoff(attempts, deadline - time.monotonic())
            if delay is not None:
                log.warning("queue unavailable (%s); retrying in %.1f s", outcome, delay)
            return delay

        outcome, _ = await attempt_until_final(attempt, next_delay)
        if isinstance(outcome, QueueUnavailable):
            raise outcome
        return outcome


def pack_result(job: EpisodeJob, trajectory: Trajectory, *, queued_s: float | None = None) -> bytes:
    """A runner's trajectory as the queue publishes it: checked against its job, stamped with the attempt
    (and with `queued_s`, the time the job waited in the queue, as its `queue` timing)."""
    if not isinstance(trajectory, Trajectory):
        raise TypeError(f"an episode runner must return a Trajectory, got {type(trajectory).__name__}")
    if trajectory.episode_id != job.episode_id:
        raise ValueError(f"trajectory episode_id {trajectory.episode_id!r} != job's {job.episode_id!r}")
    timings = trajectory.timings if queued_s is None else {**trajectory.timings, "queue": queued_s}
    return dataclasses.replace(trajectory, attempt=job.attempt, timings=timings).to_msgpack()


async def _first_of(*waits: Coroutine[Any, Any, Any]) -> None:
    """Return when the first of `waits` finishes; cancel the others."""
    tasks = [asyncio.create_task(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        await _cancel(tasks)


async def _cancel(tasks: list[asyncio.Task[Any]], timeout_s: float = 10.0) -> None:
    """Cancel tasks and wait (bounded) for them to finish unwinding."""
    pending = [task for task in tasks if not task.done()]
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.wait(pending, timeout=timeout_s)


async def run_worker(
    options: WorkerOptions,
    stop: asyncio.Event,
    *,
    factory: RunnerFactory,
    queue: EpisodeQueue | None = None,
) -> None:
    """Build the runner, open the queue (unless given one), serve metrics if asked, and work until `stop`."""
    runner = factory(options)
    metrics = WorkerMetrics()
    server = None
    if options.metrics_port is not None:
        server, _ = start_http_server(options.metrics_port, registry=metrics.registry)
    own_queue = queue is None
    queue = queue or open_queue(
        options.redis_url, options.namespace, lease_s=options.lease_s, max_attempts=options.max_attempts
    )
    worker = Worker(
        queue,
        runner,
        consumer=options.consumer,
        concurrency=options.concurrency,
        take_max=options.take_max,
        shutdown_grace_s=options.shutdown_grace_s,
        max_outage_s=options.max_outage_s,
        metrics=metrics,
    )
    log.info(
        "worker %s consuming namespace %r (concurrency %d, at most %d per read)",
        worker.consumer,
        queue.namespace,
        worker.concurrency,
        worker.take_max,
    )
    try:
        await worker.run(stop)
    finally:
        if own_queue:
            await queue.close()
        close = getattr(runner, "aclose", None)
        if close is not None:
            await close()
        if server is not None:
            server.shutdown()
