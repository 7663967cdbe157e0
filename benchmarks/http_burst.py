"""A burst of concurrent requests on kept-alive connections: how long until the server has seen them all,
through httpx's `AsyncClient` and through vistarl's aiohttp pool (`clients/pool.py`).

    .venv/bin/python -m benchmarks.http_burst                 # --requests 128 --rounds 3 --hold-s 1

The server (this module's `app`, under uvicorn in a child process) holds each request `--hold-s` and
notes when it arrived. Each client sends `--requests` POSTs at once, `--rounds` times on the same pool, as
a rollout worker's engine client sends the turns of its episodes; the first round opens the connections,
later rounds reuse them. Printed per round: the wall time, and the spread of the arrivals at the server
(first to last). Why the SGLang engine client left httpx: docs/client.md.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable

import httpx
from fastapi import FastAPI

from benchmarks.harness import benchmark_parser
from vistarl.clients.pool import LoopPool
from vistarl.devtools.servers import running_process
from vistarl.httpserver.launch import free_port

app = FastAPI()
_arrivals: list[float] = []


@app.post("/hold")
async def hold(seconds: float) -> dict[str, bool]:
    """Note the arrival, then answer after `seconds`."""
    _arrivals.append(time.monotonic())
    await asyncio.sleep(seconds)
    return {"ok": True}


@app.get("/spread")
async def spread(last: int) -> dict[str, float]:
    """Milliseconds from the first to the last of the `last` arrivals."""
    recent = _arrivals[-last:]
    return {"ms": (max(recent) - min(recent)) * 1e3}


@app.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}


Post = Callable[[str], Awaitable[None]]


async def rounds(name: str, post: Post, url: str, requests: int, count: int, hold_s: float) -> None:
    """`count` rounds of `requests` concurrent POSTs; one printed row each."""
    for number in range(count):
        started = time.perf_counter()
        await asyncio.gather(*(post(f"{url}/hold?seconds={hold_s}") for _ in range(requests)))
        wall = time.perf_counter() - started
        async with httpx.AsyncClient() as probe:
            seen = (await probe.get(f"{url}/spread", params={"last": requests})).json()["ms"]
        print(
            f"{name:<16} round {number}  wall {wall:5.2f} s  arrivals spread over {seen:7.1f} ms", flush=True
        )


async def measure(url: str, requests: int, count: int, hold_s: float) -> None:
    """Both clients, each with a pool of its own that keeps every connection alive between rounds."""
    limits = httpx.Limits(max_connections=1024, max_keepalive_connections=1024, keepalive_expiry=30)
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:

        async def by_httpx(target: str) -> None:
            (await client.post(target)).raise_for_status()

        await rounds("httpx", by_httpx, url, requests, count, hold_s)
    pool = LoopPool("burst client", max_connections=1024, keepalive_s=30, headers={})

    async def by_aiohttp(target: str) -> None:
        async with pool.session().post(target) as response:
            response.raise_for_status()

    try:
        await rounds("aiohttp (pool)", by_aiohttp, url, requests, count, hold_s)
    finally:
        await pool.close()


def main() -> None:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--requests", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--hold-s", type=float, default=1.0)
    args = parser.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "uvicorn", "benchmarks.http_burst:app", "--port", str(port)]
    with running_process([*command, "--log-level", "warning"], ready_url=f"{url}/health"):
        asyncio.run(measure(url, args.requests, args.rounds, args.hold_s))


if __name__ == "__main__":
    main()
