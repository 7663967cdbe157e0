"""An env worker's CPU and page faults per step, with glibc's default malloc thresholds and with the fixed
ones it sets (`vistarl.services.server.malloc_tuning`).

    .venv/bin/python -m benchmarks.malloc_thresholds [--envs sokoban geo3k vsi] [--seconds 8] [--warmup 3]
        [--sessions 32]

For each env, its worker (`python -m vistarl.services.server.worker_process ENV`, as `vistarl serve` starts
it) runs twice: as shipped, and with `keep_freed_memory` replaced by a no-op, which leaves glibc's defaults.
This process keeps `--sessions` episodes of `benchmarks.episodes` in flight on it, one call each, so that the
worker never waits for work. After the warm-up it reads from /proc, over `--seconds`, the CPU time of the
worker and its children (Geo3k's grading processes) and the worker's own minor page faults. Prints steps/s,
CPU ms per step and page faults per step.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

import msgpack

from benchmarks.episodes import EPISODES, Episodes
from benchmarks.harness import (
    add_window_arguments,
    benchmark_parser,
    markdown_header,
    minor_faults,
    ms_per_step,
    process_tree_cpu_s,
)

DEFAULTS_WORKER = (
    "import vistarl.services.server.worker_process as worker;"
    " worker.keep_freed_memory = lambda: False; worker.main()"
)
"""The env worker with glibc's default thresholds: `keep_freed_memory` skipped, the rest as shipped."""
SHIPPED_WORKER = ["-m", "vistarl.services.server.worker_process"]


@dataclass(frozen=True)
class Figures:
    """One worker's figures on one env."""

    env: str
    thresholds: str
    steps_per_s: float
    cpu_ms_per_step: float | None
    faults_per_step: float | None


class Driver:
    """Speaks the env worker's frames (`vistarl.services.server.worker_process`): calls out, answers in."""

    def __init__(self, command: list[str]) -> None:
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self.process.stdin is not None and self.process.stdout is not None
        self.calls: BinaryIO = self.process.stdin
        self.answers: BinaryIO = self.process.stdout
        self.unpacker = msgpack.Unpacker()
        self.ids = itertools.count(1)
        self.answer()  # the ready frame

    def send(self, op: str, args: list[Any]) -> int:
        """Queue one call (flushed by `flush`); its id."""
        call_id = next(self.ids)
        self.calls.write(msgpack.packb([call_id, op, args]))
        return call_id

    def flush(self) -> None:
        self.calls.flush()

    def answer(self) -> list[Any]:
        """The next answer frame `[call_id, ok, payload]`; a failed call raises."""
        while True:
            for frame in self.unpacker:
                if not frame[1]:
                    raise RuntimeError(f"the env worker answered an error: {frame[2]}")
                return list(frame)
            chunk = self.answers.read1(1 << 16)
            if not chunk:
                raise RuntimeError("the env worker exited")
            self.unpacker.feed(chunk)

    def stop(self) -> None:
        """Close the calls and read the answers to the end: the worker answers what it read, then exits."""
        self.calls.close()
        while self.answers.read1(1 << 16):
            pass
        self.process.wait(timeout=30)


class Load:
    """`sessions` episodes in flight on one worker: each answer sends that session's next call."""

    def __init__(self, driver: Driver, episodes: Episodes, sessions: int) -> None:
        self.driver = driver
        self.episodes = episodes
        self.numbers = itertools.count()
        self.turns: dict[str, Iterator[str]] = {}
        self.waiting: dict[int, tuple[str, str]] = {}
        for _ in range(sessions):
            self.start()
        driver.flush()

    def start(self) -> None:
        """Reset the next episode in a new session."""
        n = next(self.numbers)
        body = self.episodes.reset(n)
        session = f"s{n}"
        self.turns[session] = iter(self.episodes.responses(n))
        self.send(session, "reset", [body.get("options", {}), body.get("seed"), None, False])

    def send(self, session: str, op: str, args: list[Any]) -> None:
        self.waiting[self.driver.send(op, [session, *args])] = (session, op)

    def next_answer(self) -> bool:
        """Take one answer and send what follows it in its session; whether it answered a step."""
        call_id, _, payload = self.driver.answer()
        session, op = self.waiting.pop(call_id)
        if op != "close":
            done = op == "step" and payload[0]  # such a step closed the env in the worker
            turn = None if done else next(self.turns[session], None)
            if turn is not None:
                self.send(session, "step", [turn, False])
            else:
                if not done:
                    self.send(session, "close", [])
                del self.turns[session]
                self.start()
        self.driver.flush()
        return op == "step"


def measure(env: str, thresholds: str, command: list[str], args: Any) -> Figures:
    """Load one worker for the warm-up, then measure it for `args.seconds`."""
    driver = Driver(command)
    try:
        load = Load(driver, EPISODES[env](), args.sessions)
        deadline = time.perf_counter() + args.warmup
        while time.perf_counter() < deadline:
            load.next_answer()
        pid = driver.process.pid
        cpu, faults, steps = process_tree_cpu_s(pid), minor_faults(pid), 0
        started = time.perf_counter()
        while time.perf_counter() - started < args.seconds:
            steps += load.next_answer()
        elapsed = time.perf_counter() - started
        cpu_after, faults_after = process_tree_cpu_s(pid), minor_faults(pid)
    finally:
        driver.stop()
    cpu_s = None if cpu is None or cpu_after is None else cpu_after - cpu
    faulted = None if faults is None or faults_after is None else (faults_after - faults) / steps
    return Figures(env, thresholds, steps / elapsed, ms_per_step(cpu_s, steps), faulted)


def main() -> None:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--envs", nargs="+", default=["sokoban"], choices=sorted(EPISODES))
    add_window_arguments(parser, 8.0, 3.0, seconds_help="Measured seconds per worker.")
    parser.add_argument("--sessions", type=int, default=32)
    args = parser.parse_args()
    columns = ["env", "malloc thresholds", "steps/s", "worker CPU ms/step", "minor page faults/step"]
    print(markdown_header(*columns, text=("env", "malloc thresholds")))
    for env in args.envs:
        for thresholds, program in (("glibc's defaults", ["-c", DEFAULTS_WORKER]), ("fixed", SHIPPED_WORKER)):
            figures = measure(env, thresholds, [sys.executable, *program, f"vistarl.services.{env}"], args)
            print(row(figures), flush=True)


def row(figures: Figures) -> str:
    """One worker's figures as a markdown table row."""
    cpu = "-" if figures.cpu_ms_per_step is None else f"{figures.cpu_ms_per_step:.3f}"
    faults = "-" if figures.faults_per_step is None else f"{figures.faults_per_step:.1f}"
    cells = [figures.env, figures.thresholds, f"{figures.steps_per_s:.0f}", cpu, faults]
    return "| " + " | ".join(cells) + " |"


if __name__ == "__main__":
    main()
