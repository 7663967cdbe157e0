"""The rollout side of a training run: env server, queue, engine and in-process workers, as the config says.

With no URLs in the config, everything runs on this machine, as in production but small: the env is
served by `vistarl serve NAME` on a free loopback port (real HTTP), episodes go through the
in-memory queue to in-process rollout workers (`RolloutRunner`, the default runner), and those
generate with an in-process `HFEngine` loaded from the checkpoint, which shares nothing with the
trainer's model and receives its weights after every step. Each URL given replaces its part: `env.url`
an env server (or an OpenEnv server, with `env.openenv`'s adapter in the URL its jobs carry),
`rollout.queue` Redis (with `rollout.local_workers: 0`, the workers are external), `rollout.engine:
sglang:URL` or `hf:URL` an engine server (several URLs: an `EnginePool` of them; a router's URL with
`sync.engine_urls`: the router generates, the servers behind it take the pushes). Under torchrun with the
embedded engine, every rank embeds one and the stack gets rank 0's pool of them
(`vistarl.trainer.run.rank_engines`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from vistarl.httpserver.launch import serve_env
from vistarl.trainer.config import TrainConfig
from vistarl.trainer.queue import open_queue
from vistarl.trainer.queue.base import EpisodeQueue
from vistarl.trainer.queue.consumer import ResultConsumer
from vistarl.trainer.queue.worker import Worker
from vistarl.trainer.rollout.engines.base import Engine
from vistarl.trainer.rollout.engines.hf import HFEngine
from vistarl.trainer.rollout.engines.hf.batch import EngineStats
from vistarl.trainer.rollout.engines.loading import POOLED_RETRY_DEADLINE_S, make_engine
from vistarl.trainer.rollout.engines.pool import EnginePool
from vistarl.trainer.rollout.engines.sglang import SGLangEngine
from vistarl.trainer.rollout.job import EpisodeJob
from vistarl.trainer.rollout.processor import VLProcessor
from vistarl.trainer.rollout.rewards import load_reward_fn
from vistarl.trainer.rollout.runner import RolloutRunner
from vistarl.trainer.rollout.trajectory import Trajectory
from vistarl.trainer.run.ranks import one_node

__all__ = ["ENV_SERVER_LOG", "Gathered", "Stack", "StalePolicyError", "in_process_workers", "open_stack"]

log = logging.getLogger(__name__)

ENV_SERVER_LOG = "env-server.log"
WORKER_STOP_GRACE_S = 30.0
START_POLL_S = 0.002
"""How often a held batch start looks at the engines' queues (`StartTogether`)."""
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass
class Gathered:
    """The trajectories of one batch of jobs, and what became of the rest; `tries`: the batches a step
    played to get this one (the earlier ones had nothing to learn from), and `unusable`: how those earlier
    tries' episodes ended (a count per status, `missing` and `stale`)."""

    trajectories: list[Trajectory]
    expected: int
    stale: int = 0
    tries: int = 1
    unusable: Counter[str] = field(default_factory=Counter)

    @property
    def missing(self) -> int:
        """Jobs whose trajectory never came (dead-lettered, or still running at the deadline)."""
        return self.expected - len(self.trajectories) - self.stale


class StalePolicyError(RuntimeError):
    """A trajectory claims a policy version ahead of the trainer's: the engine serves weights this run
    did not push (a previous run's, say)."""


@dataclass(frozen=True)
class StartTogether:
    """A batch's episodes start generating as one batch at the embedded engines: their generation is held
    from the enqueue until `in_flight` first requests (what the in-process workers run at once) wait
    there, `wait_s` at most. Released as they came, the first requests would each start or join a batch
    of a few rows while the other episodes still reset (`rollout.start_together_s`)."""

    in_flight: int
    wait_s: float


@dataclass(frozen=True)
class _Arrivals:
    """The first requests a held start waits for: `expected` of them counted by `queued`, `wait_s` at most
    (none by default: nothing to wait for)."""

    queued: Callable[[], int] = lambda: 0
    expected: int = 0
    wait_s: float = 0.0

    async def wait(self) -> None:
        """Return once `expected` requests wait at the engines, or `wait_s` has passed."""
        deadline = time.monotonic() + self.wait_s
        while self.queued() < self.expected and time.monotonic() < deadline:
            await asyncio.sleep(START_POLL_S)


@dataclass(eq=False)
class Stack:
    """What the trainer drives: the queue it feeds, the engine it syncs, and the env its jobs name
    (`env`: the env server's URL, or the env's name / import path to run in the workers).

    Batches of jobs are submitted under a key and gathered by it: results are read from the queue
    once (each episode once, see `ResultConsumer`) and sorted by key, so a step's results may
    arrive while another batch is being waited for (asynchronous mode, evaluation). Results of
    unknown episodes (a previous run's leftovers) are dropped and counted. Staleness is decided here,
    and only here (`lag`).
    """

    queue: EpisodeQueue
    engine: Engine
    env: str
    max_staleness: int | None = None
    start_together: StartTogether | None = None
    policy_version: int = field(default=0, init=False)
    unexpected: int = field(default=0, init=False)
    _consumer: ResultConsumer = field(init=False)
    _keys: dict[str, str] = field(default_factory=dict, init=False)
    _batches: dict[str, Gathered] = field(default_factory=dict, init=False)
    _requests_seen: list[int] = field(default_factory=list, init=False)
    _engine_seen: EngineStats = field(default_factory=EngineStats, init=False)
    _held: bool = field(default=False, init=False)
    _arrivals: _Arrivals = field(default_factory=_Arrivals, init=False)

    def __post_init__(self) -> None:
        self._consumer = ResultConsumer(self.queue)

    @property
    def rejected(self) -> int:
        """Results that were not valid trajectories, dropped at the queue's boundary."""
        return sum(self._consumer.rejected.values())

    @property
    def duplicates(self) -> int:
        """Second results of an episode (a retried attempt whose first also finished), dropped."""
        return self._consumer.duplicates_dropped

    async def submit(self, key: str, jobs: Sequence[EpisodeJob]) -> None:
        """Enqueue a batch of jobs under `key` (unique per batch)."""
        if key in self._batches:
            raise ValueError(f"a batch named {key!r} is already in flight")
        self._batches[key] = Gathered([], expected=len(jobs))
        self._keys.update({job.episode_id: key for job in jobs})
        async with self._starting_together(len(jobs)):
            await self.queue.enqueue(jobs)

    async def gather(self, key: str, timeout_s: float) -> Gathered:
        """Wait (at most `timeout_s`) until every job of batch `key` has its trajectory; returns what came."""
        batch = self._batches[key]
        deadline = time.monotonic() + timeout_s
        while len(batch.trajectories) + batch.stale < batch.expected:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for trajectory in await self._consumer.collect(len(self._keys), min(left, 1.0)):
                self._route(trajectory)
        del self._batches[key]
        self._keys = {episode: k for episode, k in self._keys.items() if k != key}
        return batch

    @contextlib.asynccontextmanager
    async def holding(self, hold: bool) -> AsyncIterator[None]:
        """With `hold`, the engine starts no generation inside the block (requests wait), then resumes,
        once the first requests of a batch enqueued inside it have arrived (`_starting_together`)."""
        if not hold:
            yield
            return
        await self.engine.pause_generation("in_place")
        self._held = True
        try:
            yield
            await self._arrivals.wait()
        finally:
            self._held, self._arrivals = False, _Arrivals()
            await self.engine.continue_generation()

    @contextlib.asynccontextmanager
    async def _starting_together(self, jobs: int) -> AsyncIterator[None]:
        """Around a batch's enqueue: hold the embedded engines' generation until the first request of each
        of its episodes that the workers run at once waits at them (`StartTogether`), then let them start
        as one batch: the end of a hold (`holding`) waits for them, its own or, with overlapped resets, the
        one that lasts until the push."""
        queued = self._queued_at_engines()
        together = self.start_together
        if together is None or queued is None:
            yield
            return
        async with self.holding(not self._held):  # a hold of its own, or the one it is inside
            self._arrivals = _Arrivals(queued, min(jobs, together.in_flight), together.wait_s)
            yield

    def _queued_at_engines(self) -> Callable[[], int] | None:
        """How many requests wait for a batch at this process's engines, as a function; None unless every
        engine of the stack is an `HFEngine` here (a server's queue is its own)."""
        if isinstance(self.engine, EnginePool) and self.engine.router is not None:
            return None
        local = self._local_engines()
        if len(local) < len(self._engines()):
            return None
        return lambda: sum(member.queued for member in local)

    def _engines(self) -> list[Engine]:
        """The stack's engine, or its pool's members."""
        return self.engine.members if isinstance(self.engine, EnginePool) else [self.engine]

    def _local_engines(self) -> list[HFEngine]:
        """The stack's `HFEngine`s in this process: an embedded one, or a pool's colocated ones."""
        return [engine for engine in self._engines() if isinstance(engine, HFEngine)]

    def engine_requests(self) -> list[int]:
        """The generation requests each engine of a pool took since the last call; none for one engine, a
        router (which spreads them itself) or a pool that took none (the workers have their own)."""
        engine = self.engine
        if not isinstance(engine, EnginePool) or engine.router is not None:
            return []
        seen = self._requests_seen or [0] * len(engine.sent)
        self._requests_seen = list(engine.sent)
        taken = [now - before for now, before in zip(engine.sent, seen, strict=True)]
        return taken if any(taken) else []

    def engine_stats(self) -> EngineStats | None:
        """The counters of this process's HF engines (an embedded engine, or a pool's colocated ones) since
        the last call, together; None with no such engine (a server's are at its `/metrics`)."""
        local = [engine.stats for engine in self._local_engines()]
        if not local:
            return None
        now = EngineStats.total(local)
        seen, self._engine_seen = self._engine_seen, now
        return now.since(seen)

    def lag(self, trajectory: Trajectory) -> int:
        """Policy versions between the trajectory's policy and the trainer's; a negative lag is an error."""
        lag = self.policy_version - trajectory.policy_version
        if lag < 0:
            raise StalePolicyError(
                f"episode {trajectory.episode_id} was generated by policy version "
                f"{trajectory.policy_version}, ahead of the trainer's {self.policy_version}: the engine "
                "serves weights this run did not push"
            )
        return lag

    def _route(self, trajectory: Trajectory) -> None:
        """File a trajectory under its batch, or count it as stale or unexpected."""
        key = self._keys.pop(trajectory.episode_id, None)
        if key is None:
            self.unexpected += 1
            return
        lag = self.lag(trajectory)
        if self.max_staleness is not None and lag > self.max_staleness:
            self._batches[key].stale += 1
        else:
            self._batches[key].trajectories.append(trajectory)


@contextlib.asynccontextmanager
async def open_stack(
    cfg: TrainConfig,
    processor: VLProcessor,
    model_path: Path,
    run_dir: Path,
    *,
    engine: Engine | None = None,
    device: torch.device | None = None,
) -> AsyncIterator[Stack]:
    """Start (or connect to) everything the config names and stop it all on exit.

    `engine` replaces the configured engine (e.g. a scripted policy); it is closed on exit too.
    """
    async with contextlib.AsyncExitStack() as stack:
        env = cfg.env.remote or cfg.env.name
        if cfg.env.url is None and cfg.env.serve:
            env = stack.enter_context(serve_env(cfg.env.name, run_dir / ENV_SERVER_LOG))
        if engine is None:
            engine = await asyncio.to_thread(build_engine, cfg, processor, model_path, device)
        stack.push_async_callback(engine.close)
        queue = open_queue(cfg.rollout.queue, cfg.rollout.namespace)
        stack.push_async_callback(queue.close)
        if cfg.rollout.local_workers:
            generating, concurrency = _worker_placement(cfg, engine)
            workers = in_process_workers(cfg, queue, generating, processor, concurrency)
            await stack.enter_async_context(workers)
        together = None
        if cfg.rollout.start_together_s and cfg.rollout.local_workers and not cfg.rollout.async_mode:
            in_flight = cfg.rollout.local_workers * cfg.rollout.concurrency
            together = StartTogether(in_flight, cfg.rollout.start_together_s)
        yield Stack(queue, engine, env, max_staleness=cfg.rollout.max_staleness, start_together=together)


def build_engine(
    cfg: TrainConfig,
    processor: VLProcessor,
    model_path: Path,
    device: torch.device | None,
    *,
    engines: int = 1,
) -> Engine:
    """The configured engine: a server's client (see the module docstring), or an `HFEngine` on the
    checkpoint in this process, which batches its share of the episodes the in-process workers run at once
    (`engines` engines share them): its static KV cache on a GPU holds that many rows of
    `rollout.rollout_max_context_len`."""
    url = cfg.rollout.engine_url
    if url is not None:
        engine = make_engine(f"{cfg.rollout.engine_kind}:{url}", processor)
        if not cfg.sync.engine_urls:
            return engine
        deadline = POOLED_RETRY_DEADLINE_S
        servers = [SGLangEngine(u, processor, retry_deadline_s=deadline) for u in cfg.sync.engine_urls]
        return EnginePool(servers, router=engine)
    target = device or torch.device("cpu")
    return make_engine(
        f"hf:{model_path}",
        device=str(target),
        dtype=DTYPES[cfg.model.dtype],
        max_batch_size=cfg.rollout.engine_batch(engines),
        cuda_graphs=cfg.rollout.cuda_graphs,
        static_cache_len=cfg.rollout.rollout_max_context_len if target.type == "cuda" else None,
        prefix_cache_mb=cfg.rollout.prefix_cache_mb if cfg.rollout.prefix_cache else 0,
        gil_switch_ms=cfg.rollout.gil_switch_ms,
        hold_joins=cfg.rollout.hold_joins,
    )


def _worker_placement(cfg: TrainConfig, engine: Engine) -> tuple[Engine, int]:
    """The engine rank 0's workers generate on, and each one's concurrency: with every rank's workers on
    its own engine (`every_rank_plays`, a pool of the ranks' engines), rank 0's own engine and its
    share; else the stack's engine, and `rollout.concurrency`."""
    if isinstance(engine, EnginePool) and engine.local is not None and every_rank_plays(cfg):
        return engine.members[engine.local], cfg.rollout.rank_concurrency(len(engine.members))
    return engine, cfg.rollout.concurrency


def every_rank_plays(cfg: TrainConfig) -> bool:
    """Whether every torchrun rank's own workers play episodes on its own embedded engine: the queue is
    shared (`rollout.spreads_workers`) and every rank is on this node, where the run's env server and
    queue, on loopback as the single-node run starts them, reach them all. Each rank decides it alike."""
    return cfg.rollout.spreads_workers and one_node()


@contextlib.asynccontextmanager
async def in_process_workers(
    cfg: TrainConfig, queue: EpisodeQueue, engine: Engine, processor: VLProcessor, concurrency: int
) -> AsyncIterator[None]:
    """Run `rollout.local_workers` workers in this process on `queue`, each playing `concurrency` episodes
    at once on `engine`, until the block ends; then drain them (bounded) and close their env clients."""
    runner = RolloutRunner(
        engine,
        processor,
        cfg.rollout,
        reward_fn=load_reward_fn(cfg.env.reward_path),
        deadline_s=cfg.rollout.episode_timeout_s,
    )
    try:
        async with _workers(queue, runner, cfg.rollout.local_workers, concurrency):
            yield
    finally:
        await runner.envs.aclose()


@contextlib.asynccontextmanager
async def _workers(
    queue: EpisodeQueue, runner: RolloutRunner, count: int, concurrency: int
) -> AsyncIterator[None]:
    """Run `count` in-process workers on `queue` until the block ends, then drain them (bounded)."""
    stop = asyncio.Event()
    workers = [
        Worker(
            queue,
            runner,
            consumer=f"local-{os.getpid()}-{i}",
            concurrency=concurrency,
            shutdown_grace_s=0.0,
        )
        for i in range(count)
    ]
    tasks = [
        asyncio.create_task(worker.run(stop), name=f"vistarl-worker-{i}") for i, worker in enumerate(workers)
    ]
    try:
        yield
    finally:
        stop.set()
        done, pending = await asyncio.wait(tasks, timeout=WORKER_STOP_GRACE_S)
        for task in pending:
            task.cancel()
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                log.warning("a rollout worker stopped with an error: %r", task.exception())
