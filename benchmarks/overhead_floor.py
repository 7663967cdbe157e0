"""The server's overhead per step with an env that costs nothing, at a given pace, beside uvicorn's own.

    .venv/bin/python -m benchmarks.overhead_floor [--paces 410 83] [--seconds 8] [--warmup 3]

The Geo3k and VSI goal (server CPU per step beyond the env's own, at most 0.3 ms) is measured at their
pace: 400 and 80 steps a second on the 2-core machine, 1.67 requests a step (episodes of three steps, a
reset and a delete each). This benchmark takes the env's cost out, to show what the server costs at
that pace by itself. For each pace (steps/s) it puts the lean load of `benchmarks.lean_load` (64
users) on three servers:

- `vistarl serve tests.envs.counter`, default flags: three-step episodes whose steps sleep (no CPU) for
  as long as makes the env workers run that pace. Its overhead is the server's CPU per step less the
  env's own, that env played alone here (`benchmarks.server_profile.env_alone`).
- uvicorn, run as `vistarl serve` runs it (uvloop, httptools, no websockets or access log), serving
  `empty_app`: an ASGI app that answers every request with a fixed JSON body after a timer, set for the
  same pace. No server built on uvicorn spends less per request: this is the floor of the stack.
- `bare_protocol`: a uvloop protocol that parses each request with httptools and writes the same answer
  after the same timer, with none of an HTTP server's duties (no ASGI, limits, timeouts, errors or
  flow control): what the machine itself charges for a request and its wake-up.

The servers have the cores to themselves but for the load, so their figures are lower than they would be
beside a busy env.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import Iterator
from typing import Any, cast

import httptools
import uvloop

from benchmarks.episodes import Episodes
from benchmarks.harness import ServedEnv, add_window_arguments, benchmark_parser, markdown_header, served_env
from benchmarks.lean_load import Row, measure_vistarl
from benchmarks.server_profile import env_alone
from vistarl.devtools.servers import running_process
from vistarl.httpserver.launch import free_port
from vistarl.services.server.settings import ServerSettings, default_env_workers

USERS = 64
STEPS = 3  # per episode, as Geo3k's and VSI's
REQUESTS_PER_STEP = (STEPS + 2) / STEPS  # a reset and a delete per episode
EMPTY_BODY = json.dumps({"session_id": "floor", "done": False, "observation": {"text": "x" * 200}}).encode()
EMPTY_HEADERS = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(EMPTY_BODY))]
BARE_ANSWER = (
    b"HTTP/1.1 200 OK\r\n"
    + b"".join(b"%s: %s\r\n" % header for header in EMPTY_HEADERS)
    + b"\r\n"
    + EMPTY_BODY
)


async def empty_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Answer any HTTP request with `EMPTY_BODY` after `FLOOR_DELAY_S` seconds (a timer, no CPU)."""
    if scope["type"] != "http":
        return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    await asyncio.sleep(float(os.environ.get("FLOOR_DELAY_S", "0")))
    await send({"type": "http.response.start", "status": 200, "headers": EMPTY_HEADERS})
    await send({"type": "http.response.body", "body": EMPTY_BODY})


def counter_episodes(step_delay_s: float) -> Episodes:
    """Three-step episodes of the counter test env, each step sleeping `step_delay_s`."""
    options = {"target": STEPS, "step_delay_s": step_delay_s}
    return Episodes(
        "tests.envs.counter", lambda n: {"seed": n, "options": options}, lambda n: ["inc"] * STEPS
    )


class BareProtocol(asyncio.Protocol):
    """A connection answered by `bare_protocol`: every complete request gets `BARE_ANSWER` after a timer."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass it
        self.parser = httptools.HttpRequestParser(self)

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_message_complete(self) -> None:
        asyncio.get_running_loop().call_later(self.delay_s, self.transport.write, BARE_ANSWER)


def bare_protocol(port: int, delay_s: float) -> None:
    """Serve `BareProtocol` on loopback `port` until killed (run as `python -m benchmarks.overhead_floor
    --bare PORT DELAY`)."""

    async def serve() -> None:
        server = await asyncio.get_running_loop().create_server(
            lambda: BareProtocol(delay_s), "127.0.0.1", port
        )
        await server.serve_forever()

    uvloop.run(serve())


@contextlib.contextmanager
def served_bare_protocol(delay_s: float) -> Iterator[ServedEnv]:
    """`bare_protocol` in a child process on a free loopback port."""
    port = free_port()
    command = [sys.executable, "-m", "benchmarks.overhead_floor", "--bare", str(port), str(delay_s)]
    url = f"http://127.0.0.1:{port}"
    with running_process(command, ready_url=f"{url}/health") as server:
        yield ServedEnv(url, server.pid)


@contextlib.contextmanager
def served_empty_app(delay_s: float) -> Iterator[ServedEnv]:
    """uvicorn serving `empty_app` on a free loopback port, as `vistarl serve` runs uvicorn."""
    port = free_port()
    command = [
        sys.executable, "-m", "uvicorn", "benchmarks.overhead_floor:empty_app",
        "--host", "127.0.0.1", "--port", str(port), "--loop", "uvloop", "--http", "httptools", "--ws", "none",
        "--timeout-keep-alive", str(ServerSettings().keep_alive_s), "--no-access-log", "--no-server-header",
        "--log-level", "warning",
    ]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    with running_process(command, ready_url=f"{url}/health", env={"FLOOR_DELAY_S": str(delay_s)}) as server:
        yield ServedEnv(url, server.pid)


def pace_rows(pace: float, seconds: float, warmup: float) -> list[str]:
    """The table rows of one pace: `vistarl serve` of the sleeping counter env, the empty app, the bare
    protocol."""
    workers = default_env_workers() or 1
    episodes = counter_episodes(step_delay_s=workers / pace)
    with served_env(episodes.env, 2 * USERS) as server:
        served = asyncio.run(measure_vistarl(server, "vistarl serve", episodes, USERS, seconds, warmup))
    alone = env_alone(episodes, seconds, 0.5)
    request_delay_s = USERS / (pace * REQUESTS_PER_STEP)
    with served_empty_app(request_delay_s) as server:
        floor = asyncio.run(measure_vistarl(server, "uvicorn, `empty_app`", episodes, USERS, seconds, warmup))
    with served_bare_protocol(request_delay_s) as server:
        bare = asyncio.run(measure_vistarl(server, "`bare_protocol`", episodes, USERS, seconds, warmup))
    return [row_line(pace, served, alone), row_line(pace, floor, 0.0), row_line(pace, bare, 0.0)]


def row_line(pace: float, row: Row, own_ms_per_step: float | None) -> str:
    """One markdown row: the pace, the server, its steps/s, CPU per step (first process), and overhead."""
    cpu, first = row.cpu_ms_per_step, row.front_cpu_ms_per_step
    overhead = None if cpu is None or own_ms_per_step is None else cpu - own_ms_per_step
    figures = [_ms(cpu), _ms(first), _ms(own_ms_per_step), f"**{_ms(overhead)}**"]
    per_request = None if overhead is None else overhead / REQUESTS_PER_STEP
    return (
        f"| {pace:.0f} | {row.server} | {row.steps_per_s:.0f} | {' | '.join(figures)} | {_ms(per_request)} |"
    )


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def main() -> None:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--paces", type=float, nargs="+", default=[410.0, 83.0], help="Steps per second.")
    add_window_arguments(parser, 8.0, 3.0, seconds_help="Measured seconds per server.")
    parser.add_argument("--bare", nargs=2, metavar=("PORT", "DELAY_S"), help="Serve `bare_protocol` only.")
    args = parser.parse_args()
    if args.bare:
        bare_protocol(int(args.bare[0]), float(args.bare[1]))
        return
    columns = ["pace, steps/s", "server", "steps/s", "CPU ms/step", "first process", "env alone"]
    print(markdown_header(*columns, "overhead ms/step", "overhead ms/request", text=("server",)))
    for pace in args.paces:
        for line in pace_rows(pace, args.seconds, args.warmup):
            print(line, flush=True)


if __name__ == "__main__":
    main()
