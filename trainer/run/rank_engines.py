"""Every rank's embedded engine under torchrun: generation on each GPU of the run, beside its trainer shard.

With the embedded engine (`rollout.engine: hf`, and no engine handed to `run_training`) and several ranks,
each rank loads an `HFEngine` on its own device. Rank 0 drives the rollout as ever (its stack) through an
`EnginePool` of them all: its own engine in process, each other rank's over HTTP, served by that rank
with `vistarl engine serve`'s app on the rank's event loop, which is idle while the rank carries out
rank 0's commands on its compute thread. Who plays the episodes: with a shared queue and every rank on
one node (`stack.every_rank_plays`, as `vistarl up` runs), every rank's own in-process workers, on its
own engine and on its own event loop, each with its share of `rollout.concurrency`, so that no one
process carries every episode's env calls, prompts and requests (one rank's loop fed about 10 of its
engine's 64 rows on 4 GPUs, docs/benchmarks.md); else (the in-memory queue, or ranks on several nodes,
which a loopback env server would not reach) rank 0's workers, through the pool.

A push reaches every engine in process: every rank gathers the whole weights anyway
(`vistarl.trainer.weights.buckets`), so each rank copies them into its own engine, device to device, with
nothing more sent. Each engine batches its share of the episodes in flight, which sizes its static KV cache
on a GPU (`kv_cache_bytes`; docs/deploy.md, "Placement").

On one node the engines listen on loopback; across nodes, on the address of the interface that reaches
rank 0 (torchrun's MASTER_ADDR), with the engine server's bearer token if `VISTARL_API_TOKEN` is set.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

import torch
import torch.distributed as dist
from transformers import PretrainedConfig

from vistarl.httpserver.launch import serving_in_loop
from vistarl.trainer.config import TrainConfig
from vistarl.trainer.queue import open_queue
from vistarl.trainer.rollout.engines.base import Engine
from vistarl.trainer.rollout.engines.hf import HFEngine
from vistarl.trainer.rollout.engines.loading import POOLED_RETRY_DEADLINE_S
from vistarl.trainer.rollout.engines.pool import EnginePool
from vistarl.trainer.rollout.engines.server import EngineServerSettings, create_app
from vistarl.trainer.rollout.engines.sglang import SGLangEngine
from vistarl.trainer.rollout.engines.sglang_api import SERVER_KEEP_ALIVE_S
from vistarl.trainer.run.rank_learner import RankLearner
from vistarl.trainer.run.ranks import broadcast_bytes, gather_bytes, one_node
from vistarl.trainer.run.stack import DTYPES, build_engine, every_rank_plays, in_process_workers

__all__ = ["kv_cache_bytes", "rank_engines"]

LOOPBACK = "127.0.0.1"
T = TypeVar("T")


@contextlib.asynccontextmanager
async def rank_engines(
    cfg: TrainConfig, learner: RankLearner, engine: Engine | None, note: Callable[[str], None]
) -> AsyncIterator[Engine | None]:
    """Rank 0: the engine its stack drives: `engine` if given; a pool of every rank's embedded engine when
    the ranks embed one (rank 0 decides, and tells them); else None (the stack builds the configured one).
    The other ranks: for the block, serve their embedded engine, pushed in process, if they have one;
    None. `note` prints rank 0's line on the engines' sizes."""
    embeds = learner.distributed and engine is None and cfg.rollout.engine_url is None
    flag = await _collective(learner, broadcast_bytes, b"1" if embeds else b"0")
    if flag != b"1":
        yield engine
        return
    world = dist.get_world_size()
    args = (cfg, learner.processor, learner.model_path, learner.device)
    local = await asyncio.to_thread(build_engine, *args, engines=world)
    assert isinstance(local, HFEngine)
    if learner.rank != 0:
        async with _served(local) as url, learner.sending_to(local), _own_workers(cfg, learner, local, world):
            await _collective(learner, gather_bytes, url.encode())
            yield None
        return
    urls = [url.decode() for url in await _collective(learner, gather_bytes, b"")]
    deadline = POOLED_RETRY_DEADLINE_S
    others = [SGLangEngine(url, learner.processor, retry_deadline_s=deadline) for url in urls[1:]]
    note(_sizes(cfg, local, world))
    pool = EnginePool([local, *others], local=0)
    try:
        yield pool
    finally:
        await pool.close()


@contextlib.asynccontextmanager
async def _own_workers(
    cfg: TrainConfig, learner: RankLearner, engine: HFEngine, world: int
) -> AsyncIterator[None]:
    """A rank's in-process workers on its own engine, taking jobs from the run's shared queue, when every
    rank runs its own (`every_rank_plays`); nothing otherwise."""
    if not every_rank_plays(cfg):
        yield
        return
    queue = open_queue(cfg.rollout.queue, cfg.rollout.namespace)
    try:
        concurrency = cfg.rollout.rank_concurrency(world)
        async with in_process_workers(cfg, queue, engine, learner.processor, concurrency):
            yield
    finally:
        await queue.close()


def _sizes(cfg: TrainConfig, engine: HFEngine, world: int) -> str:
    """What each rank's engine batches, and the static KV cache that takes on a GPU."""
    rows, positions = cfg.rollout.engine_batch(world), cfg.rollout.rollout_max_context_len
    size = kv_cache_bytes(engine.model.config, rows, positions, DTYPES[cfg.model.dtype]) / 2**30
    workers = "every rank's workers on its own" if every_rank_plays(cfg) else "rank 0's workers on them all"
    return (
        f"{world} embedded engines, one a rank, each batching {rows} requests (on a GPU, a static KV cache "
        f"of {rows} x {positions} positions: {size:.1f} GiB); {workers}"
    )


@contextlib.asynccontextmanager
async def _served(engine: HFEngine) -> AsyncIterator[str]:
    """Serve `engine` over SGLang's HTTP API on this rank's event loop until the block ends; its URL."""
    host = _host()
    settings = EngineServerSettings(host=host, port=0, device=str(engine.device), log_level="warning")
    app = create_app(engine, settings)
    async with serving_in_loop(
        app, host, lifespan="on", log_level=settings.log_level, timeout_keep_alive=SERVER_KEEP_ALIVE_S
    ) as url:
        yield url


def _host() -> str:
    """Where this rank's engine listens: loopback when every rank is on this node, else this node's address
    on the route to rank 0's (a UDP socket's connect sends nothing)."""
    if one_node():
        return LOOPBACK
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((os.environ["MASTER_ADDR"], int(os.environ.get("MASTER_PORT", "29500"))))
        return str(probe.getsockname()[0])


async def _collective(learner: RankLearner, call: Callable[..., T], *args: object) -> T:
    """Run a collective on the learner's compute thread, where every collective of the run goes."""
    return await asyncio.get_running_loop().run_in_executor(learner.compute, call, *args)


def kv_cache_bytes(config: PretrainedConfig, rows: int, positions: int, dtype: torch.dtype) -> int:
    """The bytes of an embedded engine's static KV cache: `rows` rows of `positions` positions, a key and a
    value for every layer and key-value head."""
    text = config.get_text_config()
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    per_position = 2 * text.num_hidden_layers * text.num_key_value_heads * head_dim * dtype.itemsize
    return rows * positions * per_position
