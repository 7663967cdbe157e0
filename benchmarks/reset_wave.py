"""A wave of resets: every user of `vistarl serve sokoban` starts an episode at once, then steps it.

    .venv/bin/python -m benchmarks.reset_wave [--concurrency 64] [--waves 5] [--steps 12] [-- SERVE FLAGS...]

Episodes that end together start again together: under the lean load of `benchmarks.env_server
--compare` most Sokoban episodes are truncated at `max_steps` (100 moves), so its 64 users stay in step
and reset in waves. Here each wave is made on purpose: `--concurrency` users reset at once, then each
steps its episode `--steps` times (Up/Right/Down/Left) and deletes it; after a warm-up wave, `--waves`
waves are measured. Prints the latency of the resets, of each episode's first step and of the later
steps (mean, p50, p90, max in ms) for the server started with the flags after `--`. In an env worker
that answers in arrival order, a first step waits for every reset queued ahead of it.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import aiohttp

from benchmarks.episodes import SOKOBAN_MOVES
from benchmarks.harness import benchmark_parser, served_env
from benchmarks.lean_load import post_json


@dataclass
class Latencies:
    """Seconds per call, by kind."""

    resets: list[float] = field(default_factory=list)
    first_steps: list[float] = field(default_factory=list)
    later_steps: list[float] = field(default_factory=list)


async def episode(session: aiohttp.ClientSession, url: str, seed: int, steps: int, into: Latencies) -> None:
    """Reset the level of `seed`, step it up to `steps` times, delete it; each call's latency into `into`."""
    sent = time.perf_counter()
    session_id = (await post_json(session, f"{url}/reset", {"seed": seed}))["session_id"]
    into.resets.append(time.perf_counter() - sent)
    for turn in range(steps):
        sent = time.perf_counter()
        body = {"session_id": session_id, "action": SOKOBAN_MOVES[turn % len(SOKOBAN_MOVES)]}
        answer = await post_json(session, f"{url}/step", body)
        (into.later_steps if turn else into.first_steps).append(time.perf_counter() - sent)
        if answer["done"]:
            break
    async with session.delete(f"{url}/sessions/{session_id}") as reply:
        reply.raise_for_status()


async def waves(url: str, concurrency: int, count: int, steps: int) -> Latencies:
    """A warm-up wave, then `count` measured ones, each `concurrency` episodes started at once."""
    seeds: Iterator[int] = iter(range(1 << 30))
    measured = Latencies()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:
        for wave in range(count + 1):
            into = measured if wave else Latencies()
            await asyncio.gather(
                *(episode(session, url, next(seeds), steps, into) for _ in range(concurrency))
            )
    return measured


def summary(name: str, seconds: list[float]) -> str:
    """One markdown row: mean, p50, p90 and max in ms."""
    ordered = sorted(seconds)
    cells = [
        statistics.mean(ordered),
        ordered[len(ordered) // 2],
        ordered[int(0.9 * len(ordered))],
        ordered[-1],
    ]
    return f"| {name} | {len(ordered)} | " + " | ".join(f"{1e3 * value:.1f}" for value in cells) + " |"


def main() -> None:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--concurrency", type=int, default=64, help="Episodes started at once.")
    parser.add_argument("--waves", type=int, default=5, help="Measured waves, after one to warm up.")
    parser.add_argument("--steps", type=int, default=12, help="Steps per episode at most.")
    parser.add_argument("flags", nargs="*", help="Flags for `vistarl serve`, after `--`.")
    args = parser.parse_args()
    with served_env("sokoban", 2 * args.concurrency, *args.flags) as server:
        measured = asyncio.run(waves(server.url, args.concurrency, args.waves, args.steps))
    print("| call | count | mean ms | p50 ms | p90 ms | max ms |\n|---|---:|---:|---:|---:|---:|")
    print(summary("reset", measured.resets))
    print(summary("first step", measured.first_steps))
    print(summary("later steps", measured.later_steps))


if __name__ == "__main__":
    main()
