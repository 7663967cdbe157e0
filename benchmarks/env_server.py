"""Environment-server benchmark: the in-process floor, then HTTP throughput and latency; or, with
`--compare`, the default `vistarl serve` against OpenEnv's server, with each env's per-step overhead.

    .venv/bin/python -m benchmarks.env_server [--seconds 10] [--concurrency 1 16 64 256] [--env-workers 0 2]
        [--session-store memory redis]
    .venv/bin/python -m benchmarks.env_server --compare [--seconds 8] [--concurrency 64] [--rounds 2]
        [--envs sokoban geo3k vsi]

(a) In process: `SokobanEnv.step` + render + PNG encode, one core, steps per second (the floor).
(b) Over HTTP against a `vistarl serve sokoban --env-workers W` process, for each W (0: envs in the
    server's threads; W > 0: W env worker processes) and each session store (`memory`: the server's
    own; `redis`: `--session-store` on a private redis-server this benchmark starts, without
    persistence, so every step also stores the env's state and answer there): N virtual users on one
    `AsyncEnvClient` in one asyncio client process, each playing episodes back to back (reset, step
    until done, close). Steps per second and client-side p50 / p99 latency of /step, after a warm-up.
Both sides use the same moves (a fixed Up/Right/Down/Left walk on default 6x6 levels). Prints a
markdown table. Its CPU columns are the CPU time per step of the processes doing the env work (this
one in process; the server and its env workers over HTTP) and of the client, which stay meaningful on
a busy machine where wall-clock rates do not. With the `redis` store, the redis-server's CPU per step
(from its `INFO cpu`) is a column of its own.

`--compare` (`benchmarks/server_compare.py`) measures servers at their default settings, each in turn, under
the same lean load: Sokoban on `vistarl serve sokoban` and, when `openenv-core` is installed, on
OpenEnv's own server (`benchmarks.openenv_sokoban`); then each of `--envs` on `vistarl serve` alone,
with its in-process floor, so that the server's own CPU per step (total minus the env's) shows.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass

import redis

from benchmarks.episodes import EPISODES, SOKOBAN_MOVES
from benchmarks.harness import (
    LoadFigures,
    add_load_arguments,
    benchmark_parser,
    cpu_between,
    markdown_header,
    ms_per_step,
    process_cpu_s,
    process_tree_cpu_s,
    served_env,
)
from benchmarks.server_compare import compare
from vistarl.clients.http import AsyncEnvClient, RetryPolicy
from vistarl.clients.images import encode_image
from vistarl.devtools.servers import redis_server
from vistarl.services.sokoban import SokobanEnv, SokobanOptions

ACTIONS = SOKOBAN_MOVES


@dataclass(frozen=True, kw_only=True)
class Figures(LoadFigures):
    """One benchmark row: in process or over HTTP, with its env workers and session store."""

    mode: str
    env_workers: int | None = None
    store: str | None = None
    concurrency: int = 1
    server_process_cpu_ms_per_step: float | None = None
    store_cpu_ms_per_step: float | None = None


def in_process(seconds: float) -> Figures:
    """Step + render + PNG-encode Sokoban in this process for `seconds`; a new level at each episode end."""
    options = SokobanOptions()
    env = SokobanEnv(options)
    env.reset()
    steps = 0
    started, cpu_started = time.perf_counter(), time.process_time()
    while time.perf_counter() - started < seconds:
        result = env.step(ACTIONS[steps % len(ACTIONS)])
        for image in result.observation["images"]:
            encode_image(image)
        steps += 1
        if result.done:
            env = SokobanEnv(options)
            env.reset()
    cpu_ms = 1e3 * (time.process_time() - cpu_started) / steps
    return Figures(
        mode="in-process", steps_per_s=steps / (time.perf_counter() - started), cpu_ms_per_step=cpu_ms
    )


User = Callable[[AsyncEnvClient, float, float], Awaitable[list[float]]]
"""A virtual user: plays episodes until the stop instant; returns its step latencies after the warm-up."""


async def over_http(
    server: Server,
    setting: tuple[int, str],
    concurrency: int,
    seconds: float,
    warmup: float,
    user: User | None = None,
) -> Figures:
    """Run `concurrency` virtual users (Sokoban walkers by default) for warmup + seconds against `server`
    (its `setting`: env workers and session store); count the steps that finish after the warm-up.

    The users share one `AsyncEnvClient`, as the episodes of a rollout worker do: its aiohttp pool costs
    about 0.3 ms of client CPU per step at any concurrency, so the client does not measure itself.
    """
    retry = RetryPolicy(deadline_s=warmup + seconds + 60.0)
    async with AsyncEnvClient(server.url, token="", timeout=60.0, retry=retry) as client:
        start = time.perf_counter()
        measure_from, stop_at = start + warmup, start + warmup + seconds
        server_cpu = asyncio.create_task(cpu_between(server.pid, measure_from, stop_at, process_tree_cpu_s))
        front_cpu = asyncio.create_task(cpu_between(server.pid, measure_from, stop_at, process_cpu_s))
        client_cpu = asyncio.create_task(cpu_between(os.getpid(), measure_from, stop_at, process_cpu_s))
        store_cpu = asyncio.create_task(cpu_between(0, measure_from, stop_at, server.store_cpu_s))
        play = user or _user
        per_user = await asyncio.gather(*(play(client, measure_from, stop_at) for _ in range(concurrency)))
    latencies = sorted(latency for user in per_user for latency in user)
    steps = len(latencies)
    return Figures.from_window(
        latencies,
        seconds,
        await server_cpu,
        await client_cpu,
        mode="HTTP",
        env_workers=setting[0],
        store=setting[1],
        concurrency=concurrency,
        server_process_cpu_ms_per_step=ms_per_step(await front_cpu, steps),
        store_cpu_ms_per_step=ms_per_step(await store_cpu, steps),
    )


async def _user(client: AsyncEnvClient, measure_from: float, stop_at: float) -> list[float]:
    """One virtual user: play episodes back to back until `stop_at`; its step latencies after the warm-up."""
    latencies: list[float] = []
    turn = 0
    while time.perf_counter() < stop_at:
        async with client.episode() as episode:
            while not episode.done and (sent := time.perf_counter()) < stop_at:
                await episode.step(ACTIONS[turn % len(ACTIONS)])
                finished = time.perf_counter()
                if measure_from <= sent and finished <= stop_at:
                    latencies.append(finished - sent)
                turn += 1
    return latencies


def markdown(rows: list[Figures], floor: float) -> str:
    """The figures as a markdown table, each throughput also as a share of the in-process floor."""

    def ms(value: float | None, digits: int = 1) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    columns = ["mode", "env workers", "session store", "concurrency", "steps/s", "% of floor", "p50 ms"]
    columns += ["p99 ms", "CPU ms/step", "of which server process", "client CPU ms/step", "Redis CPU ms/step"]
    lines = [markdown_header(*columns, text=("mode", "session store"))]
    for r in rows:
        workers = "-" if r.env_workers is None else r.env_workers
        cells = [
            r.mode,
            workers,
            r.store or "-",
            r.concurrency,
            f"{r.steps_per_s:.0f}",
            f"{100 * r.steps_per_s / floor:.0f}%",
        ]
        cells += [ms(r.p50_ms), ms(r.p99_ms), ms(r.cpu_ms_per_step, 2)]
        cells += [ms(r.server_process_cpu_ms_per_step, 2), ms(r.client_cpu_ms_per_step, 2)]
        cells += [ms(r.store_cpu_ms_per_step, 2)]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = benchmark_parser(__doc__)
    add_load_arguments(parser, [1, 16, 64, 256], 3.0, "Unmeasured seconds before each HTTP row.")
    parser.add_argument(
        "--env-workers", type=int, nargs="+", default=[0, 2], help="Server settings to measure, in turn."
    )
    parser.add_argument(
        "--session-store",
        nargs="+",
        choices=["memory", "redis"],
        default=["memory"],
        help="Session stores to measure, in turn: the server's own, or a private redis-server.",
    )
    parser.add_argument(
        "--compare",
        action="store_true",
        help="Default servers under one lean load: vistarl against OpenEnv (if installed) on Sokoban, at the "
        "last --concurrency, then each of --envs with its floor (benchmarks/server_compare.py).",
    )
    parser.add_argument(
        "--rounds", type=int, default=2, help="With --compare: vistarl/OpenEnv pairs, in turn."
    )
    parser.add_argument(
        "--envs",
        nargs="+",
        choices=sorted(EPISODES),
        default=["sokoban", "geo3k", "vsi"],
        help="With --compare.",
    )
    args = parser.parse_args()
    if args.compare:
        print(compare(args.envs, args.concurrency[-1], args.seconds, args.warmup, args.rounds))
        return

    rows = [in_process(args.seconds)]
    for store in args.session_store:
        for env_workers in args.env_workers:
            with serving(env_workers, store, 2 * max(args.concurrency)) as server:
                for concurrency in args.concurrency:
                    setting = (env_workers, store)
                    figures = over_http(server, setting, concurrency, args.seconds, args.warmup)
                    rows.append(asyncio.run(figures))
    print(markdown(rows, rows[0].steps_per_s))


@dataclass(frozen=True)
class Server:
    """A server under test: its URL, its pid, and how to read its session store's CPU seconds."""

    url: str
    pid: int
    store_cpu_s: Callable[[int], float | None]


def redis_cpu_s(url: str) -> float:
    """CPU seconds (user + system) that the redis-server at `url` has used, from its `INFO cpu`."""
    with redis.Redis.from_url(url) as client:
        info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


@contextlib.contextmanager
def serving(env_workers: int, store: str, max_sessions: int, env: str = "sokoban") -> Iterator[Server]:
    """`vistarl serve ENV` with these settings (and its own redis-server for the `redis` store) until the
    block ends."""
    with contextlib.ExitStack() as stack:
        redis_url = None if store == "memory" else stack.enter_context(redis_server())
        store_flags = [] if redis_url is None else ["--session-store", redis_url]
        served = stack.enter_context(
            served_env(env, max_sessions, "--env-workers", str(env_workers), *store_flags)
        )
        yield Server(served.url, served.pid, lambda _: None if redis_url is None else redis_cpu_s(redis_url))


if __name__ == "__main__":
    main()
