"""The lean load the server benchmarks put on a server: virtual users playing `benchmarks.episodes`.

- On `vistarl serve`, over HTTP on one aiohttp session (a connection per user): `POST /reset`,
  `POST /step` until done, `DELETE /sessions/{id}` (the finished session's tombstone with it).
- On OpenEnv's server, over its WebSocket sessions (`/ws`): one connection per user, opened as OpenEnv's
  `EnvClient` opens it (`websockets`, its defaults), a `reset` message per episode and a `step` message
  per turn.
Both decode every answer with `json.loads`. Steps are those sent after the warm-up and answered before
the end; latency is the client's, send to answer. CPU columns come from /proc: the server's process tree
(its env workers and grading processes included), its first process alone, and this client.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp

from benchmarks.episodes import Episodes
from benchmarks.harness import (
    LoadFigures,
    ServedEnv,
    cpu_between,
    ms_per_step,
    process_cpu_s,
    process_tree_cpu_s,
)

UserRun = Callable[[Iterator[int], float, float], Awaitable[list[float]]]
"""A virtual user: plays the episodes numbered by the iterator until the stop instant; returns its step
latencies after the warm-up."""


@dataclass(frozen=True, kw_only=True)
class Row(LoadFigures):
    """One server (or floor) measured on one env; `front_cpu_ms_per_step` is its first process's CPU."""

    server: str
    env: str
    load: float
    front_cpu_ms_per_step: float | None = None


async def measure(
    server: str, env: str, pid: int, user: UserRun, concurrency: int, seconds: float, warmup: float
) -> Row:
    """Run `concurrency` users for warmup + seconds against the server process `pid`."""
    load = os.getloadavg()[0]
    start = time.perf_counter()
    measure_from, stop_at = start + warmup, start + warmup + seconds
    tree_cpu = asyncio.create_task(cpu_between(pid, measure_from, stop_at, process_tree_cpu_s))
    front_cpu = asyncio.create_task(cpu_between(pid, measure_from, stop_at, process_cpu_s))
    client_cpu = asyncio.create_task(cpu_between(os.getpid(), measure_from, stop_at, process_cpu_s))
    numbers = itertools.count()
    per_user = await asyncio.gather(*(user(numbers, measure_from, stop_at) for _ in range(concurrency)))
    latencies = sorted(latency for one in per_user for latency in one)
    if len(latencies) < 2:
        raise RuntimeError(f"{server} answered {len(latencies)} steps of {env} in {seconds} s; run longer")

    return Row.from_window(
        latencies,
        seconds,
        await tree_cpu,
        await client_cpu,
        server=server,
        env=env,
        load=load,
        front_cpu_ms_per_step=ms_per_step(await front_cpu, len(latencies)),
    )


async def measure_vistarl(
    server: ServedEnv, name: str, episodes: Episodes, concurrency: int, seconds: float, warmup: float
) -> Row:
    """`concurrency` users of `vistarl_user` (one aiohttp session, a connection each) on `server`."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:
        user = vistarl_user(session, server.url, episodes)
        return await measure(name, episodes.env, server.pid, user, concurrency, seconds, warmup)


def vistarl_user(session: aiohttp.ClientSession, url: str, episodes: Episodes) -> UserRun:
    """A user of `vistarl serve` over HTTP: reset, step until done, delete the session."""

    async def play(numbers: Iterator[int], measure_from: float, stop_at: float) -> list[float]:
        latencies: list[float] = []
        while time.perf_counter() < stop_at:
            n = next(numbers)
            session_id = (await post_json(session, f"{url}/reset", episodes.reset(n)))["session_id"]
            for response in episodes.responses(n):
                if (sent := time.perf_counter()) >= stop_at:
                    break
                answer = await post_json(
                    session, f"{url}/step", {"session_id": session_id, "action": response}
                )
                _record(latencies, sent, measure_from, stop_at)
                if answer["done"]:
                    break
            async with session.delete(f"{url}/sessions/{session_id}") as reply:
                reply.raise_for_status()
        return latencies

    return play


async def post_json(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> Any:
    """POST `body` as JSON; the decoded answer (an error status raises)."""
    data = json.dumps(body)
    async with session.post(url, data=data, headers={"Content-Type": "application/json"}) as reply:
        reply.raise_for_status()
        return json.loads(await reply.read())


def openenv_user(url: str, episodes: Episodes) -> UserRun:
    """A user of OpenEnv's server over one WebSocket session: a reset message per episode, then steps."""
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    async def play(numbers: Iterator[int], measure_from: float, stop_at: float) -> list[float]:
        latencies: list[float] = []
        async with connect(f"ws{url.removeprefix('http')}/ws", max_size=None) as ws:
            while time.perf_counter() < stop_at:
                n = next(numbers)
                await _exchange(ws, {"type": "reset", "data": episodes.reset(n)})
                for response in episodes.responses(n):
                    if (sent := time.perf_counter()) >= stop_at:
                        break
                    answer = await _exchange(ws, {"type": "step", "data": {"action": response}})
                    _record(latencies, sent, measure_from, stop_at)
                    if answer["data"]["done"]:
                        break
            await ws.send(json.dumps({"type": "close"}))
            with contextlib.suppress(ConnectionClosed):  # the server closes: its side ends cleanly
                await ws.recv()
        return latencies

    return play


async def _exchange(ws: Any, message: dict[str, Any]) -> Any:
    await ws.send(json.dumps(message))
    answer = json.loads(await ws.recv())
    if answer.get("type") != "observation":
        raise RuntimeError(f"OpenEnv answered {answer}")
    return answer


def _record(latencies: list[float], sent: float, measure_from: float, stop_at: float) -> None:
    """Keep a step's latency if it was sent after the warm-up and answered before the end."""
    finished = time.perf_counter()
    if measure_from <= sent and finished <= stop_at:
        latencies.append(finished - sent)
