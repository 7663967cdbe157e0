"""Environment-server throughput: many sessions stepping at once against a real `vistarl serve` process.

    .venv/bin/python -m benchmarks.server_throughput --sessions 64 --steps 20
    .venv/bin/python -m benchmarks.server_throughput --env sokoban --options '{}' --action Up

Prints steps per second and the client-side latency percentiles of /step.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import httpx

from tests.servers import free_port, running_process, vistarl_cmd


async def run_session(url: str, options: dict[str, object], steps: int, action: str) -> list[float]:
    """One session on its own connection, as one rollout worker would drive it: reset, then `steps`
    steps (starting a new episode when one ends); returns the step latencies.

    A client per session also keeps httpx's shared-pool slowdown at high concurrency out of the figures.
    """
    latencies: list[float] = []
    async with httpx.AsyncClient(base_url=url, timeout=60.0) as client:
        session = (await client.post("/reset", json={"options": options})).json()["session_id"]
        for _ in range(steps):
            started = time.perf_counter()
            answer = await client.post("/step", json={"session_id": session, "action": action})
            latencies.append(time.perf_counter() - started)
            answer.raise_for_status()
            if answer.json()["done"]:
                await client.delete(f"/sessions/{session}")
                session = (await client.post("/reset", json={"options": options})).json()["session_id"]
        await client.delete(f"/sessions/{session}")
    return latencies


async def measure(url: str, sessions: int, steps: int, options: dict[str, object], action: str) -> None:
    """Run `sessions` sessions at once and print throughput and latency percentiles."""
    started = time.perf_counter()
    results = await asyncio.gather(*(run_session(url, options, steps, action) for _ in range(sessions)))
    elapsed = time.perf_counter() - started
    latencies = [lat for per_session in results for lat in per_session]
    p50, p99 = (statistics.quantiles(latencies, n=100)[i] * 1e3 for i in (49, 98))
    print(f"sessions={sessions} steps/session={steps} total_steps={len(latencies)} wall={elapsed:.2f}s")
    print(f"throughput={len(latencies) / elapsed:.0f} steps/s  p50={p50:.1f}ms  p99={p99:.1f}ms")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--env", default="tests.envs.counter")
    parser.add_argument("--options", default='{"target": 1000, "image_size": 384}', help="env options, JSON")
    parser.add_argument("--action", default="inc")
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = vistarl_cmd("serve", args.env, "--port", str(port), "--log-level", "warning")
    with running_process(command, ready_url=f"{url}/health", env={"VISTARL_API_TOKEN": ""}):
        asyncio.run(measure(url, args.sessions, args.steps, json.loads(args.options), args.action))


if __name__ == "__main__":
    main()
