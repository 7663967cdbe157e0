"""`benchmarks.env_server --compare`: the default `vistarl serve` against OpenEnv's server, and the server's
own CPU per step for each env.

Each server runs as its own process at its default settings (vistarl: `vistarl serve ENV`, capacity
raised to 2x the users; OpenEnv: `benchmarks.openenv_sokoban`) and gets the same lean load from this
process: N virtual users, each playing episodes back to back (`benchmarks.episodes`: the same seeds and
responses against both), for a warm-up and then the measured window.
- vistarl, over HTTP on one aiohttp session (a connection per user): `POST /reset`, `POST /step` until
  done, `DELETE /sessions/{id}` (the finished session's tombstone with it).
- OpenEnv, over its WebSocket sessions (`/ws`): one connection per user, opened as OpenEnv's `EnvClient`
  opens it (`websockets`, its defaults), a `reset` message per episode and a `step` message per turn.
Both decode every answer with `json.loads`. Steps are those sent after the warm-up and answered before
the end; latency is the client's, send to answer. CPU columns come from /proc: the server's process tree
(its env workers and grading processes included), its first process alone, and this client.

The floor of each env is its own work, in this process: `EnvFactory.create`, reset, step and the PNG
encoding of every image, for the same episodes. **Overhead** is the server's CPU per step minus that
floor: routing, validation, the JSON answer, the session rules, the frames to env workers. Every row
notes the 1-minute load average when it started, since a shared machine moves wall-clock figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import itertools
import json
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp

from benchmarks.episodes import EPISODES, Episodes
from benchmarks.harness import cpu_between, ms_per_step, process_cpu_s, process_tree_cpu_s, served_env
from clients.images import encode_image
from services.env_api import load_env_factory
from tests.servers import free_port, running_process

UserRun = Callable[[Iterator[int], float, float], Awaitable[list[float]]]
"""A virtual user: plays the episodes numbered by the iterator until the stop instant; returns its step
latencies after the warm-up."""


@dataclass(frozen=True)
class Row:
    """One server (or floor) measured on one env."""

    server: str
    env: str
    load: float
    steps_per_s: float
    cpu_ms_per_step: float | None
    p50_ms: float | None = None
    p99_ms: float | None = None
    front_cpu_ms_per_step: float | None = None
    client_cpu_ms_per_step: float | None = None


def openenv_installed() -> bool:
    """Whether `openenv-core` can be imported here (it is not a dependency of the project)."""
    return importlib.util.find_spec("openenv") is not None


def floor(episodes: Episodes, seconds: float) -> Row:
    """The env's own work in this process for `seconds`: create, reset, step, PNG-encode each image."""
    factory = load_env_factory(episodes.env)
    options = factory.options_model.model_validate({})
    load, steps = os.getloadavg()[0], 0
    started, cpu_started = time.perf_counter(), process_tree_cpu_s(os.getpid())
    for n in itertools.count():
        if time.perf_counter() - started >= seconds:
            break
        env = factory.create(options, episodes.reset(n).get("seed"), None)
        obs, _ = env.reset()
        _encode(obs)
        for response in episodes.responses(n):
            obs, done, _ = env.step(response)
            _encode(obs)
            steps += 1
            if done:
                break
        env.close()
    elapsed, cpu_ended = time.perf_counter() - started, process_tree_cpu_s(os.getpid())
    cpu_s = None if cpu_started is None or cpu_ended is None else cpu_ended - cpu_started
    return Row(
        "in process (the env's own work)", episodes.env, load, steps / elapsed, ms_per_step(cpu_s, steps)
    )


def _encode(obs: Any) -> None:
    for image in obs["images"]:
        encode_image(image)


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
    cuts = statistics.quantiles(latencies, n=100)
    steps = len(latencies)
    return Row(
        server,
        env,
        load,
        steps / seconds,
        ms_per_step(await tree_cpu, steps),
        cuts[49] * 1e3,
        cuts[98] * 1e3,
        ms_per_step(await front_cpu, steps),
        ms_per_step(await client_cpu, steps),
    )


def vistarl_user(session: aiohttp.ClientSession, url: str, episodes: Episodes) -> UserRun:
    """A user of `vistarl serve` over HTTP: reset, step until done, delete the session."""

    async def play(numbers: Iterator[int], measure_from: float, stop_at: float) -> list[float]:
        latencies: list[float] = []
        while time.perf_counter() < stop_at:
            n = next(numbers)
            session_id = (await _post(session, f"{url}/reset", episodes.reset(n)))["session_id"]
            for response in episodes.responses(n):
                if (sent := time.perf_counter()) >= stop_at:
                    break
                answer = await _post(session, f"{url}/step", {"session_id": session_id, "action": response})
                _record(latencies, sent, measure_from, stop_at)
                if answer["done"]:
                    break
            async with session.delete(f"{url}/sessions/{session_id}") as reply:
                reply.raise_for_status()
        return latencies

    return play


async def _post(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> Any:
    data = json.dumps(body)
    async with session.post(url, data=data, headers={"Content-Type": "application/json"}) as reply:
        reply.raise_for_status()
        return json.loads(await reply.read())


def openenv_user(url: str, episodes: Episodes) -> UserRun:
    """A user of OpenEnv's server over one WebSocket session: a reset message per episode, then steps."""
    from websockets.asyncio.client import connect

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


@contextlib.contextmanager
def openenv_sokoban(max_sessions: int) -> Iterator[tuple[str, int]]:
    """OpenEnv's server for the project's Sokoban (`benchmarks.openenv_sokoban`): its URL and pid."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "benchmarks.openenv_sokoban", "--port", str(port)]
    with running_process([*command, "--max-sessions", str(max_sessions)], ready_url=f"{url}/health") as proc:
        yield url, proc.pid


async def on_vistarl(episodes: Episodes, concurrency: int, seconds: float, warmup: float) -> Row:
    """`vistarl serve ENV` at its defaults under the lean HTTP load."""
    with served_env(episodes.env, 2 * concurrency) as server:
        connector = aiohttp.TCPConnector(limit=concurrency)
        async with aiohttp.ClientSession(connector=connector) as session:
            user = vistarl_user(session, server.url, episodes)
            return await measure(
                "vistarl serve", episodes.env, server.pid, user, concurrency, seconds, warmup
            )


async def on_openenv(episodes: Episodes, concurrency: int, seconds: float, warmup: float) -> Row:
    """OpenEnv's server under the lean WebSocket load."""
    with openenv_sokoban(2 * concurrency) as (url, pid):
        user = openenv_user(url, episodes)
        return await measure("OpenEnv", episodes.env, pid, user, concurrency, seconds, warmup)


def compare(envs: list[str], concurrency: int, seconds: float, warmup: float, rounds: int) -> str:
    """Every measurement, as the markdown `--compare` prints."""
    sokoban = EPISODES["sokoban"]()
    peer = openenv_installed()
    rows: list[Row] = []
    pairs: list[tuple[Row, Row]] = []
    for _ in range(rounds):
        ours = asyncio.run(on_vistarl(sokoban, concurrency, seconds, warmup))
        rows.append(ours)
        if peer:
            theirs = asyncio.run(on_openenv(sokoban, concurrency, seconds, warmup))
            rows.append(theirs)
            pairs.append((ours, theirs))
    overheads: list[tuple[Row, Row]] = []
    for name in envs:
        episodes = sokoban if name == "sokoban" else EPISODES[name]()
        own = floor(episodes, seconds)
        served = (
            rows[0] if name == "sokoban" else asyncio.run(on_vistarl(episodes, concurrency, seconds, warmup))
        )
        rows += [own] if name == "sokoban" else [own, served]
        overheads.append((own, served))
    parts = [table(rows), ratios(pairs) if peer else "OpenEnv: skipped (pip install openenv-core to add it)"]
    return "\n\n".join([*parts, overhead_table(overheads)])


def _ms(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def table(rows: list[Row]) -> str:
    """Every row measured, in order."""
    lines = [
        "| server | env | load avg | steps/s | p50 ms | p99 ms | server CPU ms/step | of which first process "
        "| client CPU ms/step |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        cells = [r.server, r.env, f"{r.load:.1f}", f"{r.steps_per_s:.0f}", _ms(r.p50_ms, 1), _ms(r.p99_ms, 1)]
        cells += [_ms(r.cpu_ms_per_step), _ms(r.front_cpu_ms_per_step), _ms(r.client_cpu_ms_per_step)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def ratios(pairs: list[tuple[Row, Row]]) -> str:
    """Each round's vistarl row against the OpenEnv row measured right after it."""
    lines = [
        "| round | vistarl steps/s | OpenEnv steps/s | steps/s ratio | vistarl p99 ms | OpenEnv p99 ms "
        "| p99 ratio |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for index, (ours, theirs) in enumerate(pairs, 1):
        assert ours.p99_ms is not None and theirs.p99_ms is not None
        cells = [str(index), f"{ours.steps_per_s:.0f}", f"{theirs.steps_per_s:.0f}"]
        cells += [
            f"{ours.steps_per_s / theirs.steps_per_s:.2f}x",
            f"{ours.p99_ms:.1f}",
            f"{theirs.p99_ms:.1f}",
        ]
        cells.append(f"{ours.p99_ms / theirs.p99_ms:.2f}x")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def overhead_table(pairs: list[tuple[Row, Row]]) -> str:
    """Each env's server CPU per step against its own work (the floor): the server's overhead."""
    lines = [
        "| env | server CPU ms/step | env's own CPU ms/step | overhead ms/step |",
        "|---|---:|---:|---:|",
    ]
    for own, served in pairs:
        spent, work = served.cpu_ms_per_step, own.cpu_ms_per_step
        extra = None if spent is None or work is None else spent - work
        lines.append(f"| {own.env} | {_ms(spent)} | {_ms(work)} | {_ms(extra)} |")
    return "\n".join(lines)
