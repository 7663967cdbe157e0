"""What the GIL's switch interval costs a thread of small torch calls beside a thread running Python.

    python -m benchmarks.gil_switch
    python -m benchmarks.gil_switch --ops 1500 --intervals-ms 5 1 0.1 0.05 0.02

Every torch call made from Python gives the GIL up while it runs and takes it back after. When another
thread is running Python, taking it back waits until that thread is made to drop it, which the interpreter
asks for only after the waiting thread has waited one switch interval (`sys.setswitchinterval`, 5 ms by
default). An eager prompt pass or a packing of trajectories is a thousand or more such calls; the event
loop's envs, token tracks and prompt preparation are the Python beside them (docs/engines.md, "Host time").

For each interval: `--ops` additions on a small CPU tensor (one torch thread), timed alone and beside a
thread running a pure-Python loop (the best and the worst of `--rounds`), and that loop's iterations per
second alone and while the additions run: what a shorter interval costs the Python side.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from benchmarks.harness import benchmark_parser


def small_ops(count: int) -> float:
    """Seconds for `count` torch calls on a tiny tensor, each one giving the GIL up and taking it back."""
    value = torch.ones(8)
    started = time.perf_counter()
    for _ in range(count):
        value = value.add(1.0)
    return time.perf_counter() - started


class BusyPython:
    """A thread running a pure-Python loop, counting its iterations."""

    def __init__(self) -> None:
        self.iterations = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            sum(i * i for i in range(200))
            self.iterations += 1

    @contextmanager
    def running(self) -> Iterator[BusyPython]:
        self._thread.start()
        time.sleep(0.05)
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join()


def rate_alone(seconds: float) -> float:
    """The busy loop's iterations per second with nothing beside it."""
    with BusyPython().running() as busy:
        start = busy.iterations
        time.sleep(seconds)
        return (busy.iterations - start) / seconds


def measure(interval_ms: float, args: argparse.Namespace) -> str:
    """One printed row for one switch interval."""
    sys.setswitchinterval(interval_ms / 1000)
    alone = min(small_ops(args.ops) for _ in range(args.rounds))
    python_alone = rate_alone(0.5)
    with BusyPython().running() as busy:
        start, started = busy.iterations, time.perf_counter()
        beside = sorted(small_ops(args.ops) for _ in range(args.rounds))
        python_beside = (busy.iterations - start) / (time.perf_counter() - started)
    return (
        f"switch interval {interval_ms:6.3f} ms: {args.ops} torch calls alone {alone * 1e3:7.2f} ms,"
        f" beside busy Python {beside[0] * 1e3:8.2f}-{beside[-1] * 1e3:8.2f} ms;"
        f" the Python loop {python_alone:9.0f}/s alone, {python_beside:9.0f}/s beside the calls"
    )


def main() -> None:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--ops", type=int, default=1500, help="torch calls in a row (an eager prompt pass's)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--intervals-ms", type=float, nargs="+", default=[5.0, 1.0, 0.1, 0.05, 0.02])
    args = parser.parse_args()
    torch.set_num_threads(1)
    before = sys.getswitchinterval()
    try:
        for interval in args.intervals_ms:
            print(measure(interval, args), flush=True)
    finally:
        sys.setswitchinterval(before)


if __name__ == "__main__":
    main()
