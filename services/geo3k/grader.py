"""Bounded-time grading: a pool of `services.geo3k.grade_worker` processes, each past its deadline killed.

math-verify can spend unbounded time in sympy (`9^{9^{9}}`), and its SIGALRM timeout only works in a
main thread, while the env runs in server threads, env worker processes and rollout threads. So each
grading goes to a small process over a pipe (JSON lines, no pickle) and the caller waits at most
`timeout_s` for the answer; a process that overruns is killed and replaced on demand, and the grading
is a TIMEOUT verdict (score 0, counted by the env). A grading also waits at most `timeout_s` for a free
process. Processes start lazily, up to `max_workers`, and are shared by every env of this process
(`shared_pool`). The pipe round trip costs a fraction of a millisecond (docs/benchmarks.md, "Geo3k").
"""

from __future__ import annotations

import atexit
import contextlib
import enum
import json
import os
import select
import subprocess
import sys
import threading
import time
from typing import Any

START_TIMEOUT_S = 60.0
STOP_GRACE_S = 1.0
READ_CHUNK = 1 << 16
DEFAULT_WORKERS = max(1, min(4, os.cpu_count() or 1))


class Verdict(str, enum.Enum):
    """The outcome of one grading."""

    CORRECT = "correct"
    WRONG = "wrong"
    TIMEOUT = "timeout"
    """No answer within the deadline: the grading process was killed, or none was free in time."""
    FAILED = "failed"
    """The grading process died or answered with an error."""

    @property
    def score(self) -> float:
        """1.0 for a correct answer, else 0.0."""
        return 1.0 if self is Verdict.CORRECT else 0.0


class GraderStartError(RuntimeError):
    """A grading process could not be started (math-verify missing, or no ready line in time)."""


class GraderExitedError(RuntimeError):
    """A grading process closed its output."""


class GraderProcess:
    """One grading process and the unread part of its output."""

    def __init__(self, start_timeout_s: float = START_TIMEOUT_S) -> None:
        """Start the process and wait (at most `start_timeout_s`) until it says it is ready."""
        command = [sys.executable, "-m", "services.geo3k.grade_worker"]
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self._buffer = b""
        try:
            ready = self._read_line(time.monotonic() + start_timeout_s)
        except (TimeoutError, GraderExitedError) as exc:
            self.kill()
            raise GraderStartError(f"the grading process did not start: {exc}") from None
        if json.loads(ready) != {"ready": True}:
            self.kill()
            raise GraderStartError(f"the grading process said {ready!r} instead of being ready")

    def ask(self, request: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Send one request; its reply, or TimeoutError after `timeout_s`."""
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(json.dumps(request).encode() + b"\n")
            self.process.stdin.flush()
        except (BrokenPipeError, ValueError) as exc:
            raise GraderExitedError(f"cannot write to the grading process: {exc}") from None
        reply: dict[str, Any] = json.loads(self._read_line(time.monotonic() + timeout_s))
        return reply

    def kill(self) -> None:
        """Stop the process now and reap it."""
        self.process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(STOP_GRACE_S)
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()

    def _read_line(self, deadline: float) -> bytes:
        """The next output line, waiting no later than `deadline` (monotonic seconds)."""
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                raise TimeoutError("no answer in time")
            chunk = os.read(fd, READ_CHUNK)
            if not chunk:
                raise GraderExitedError(f"the grading process exited with {self.process.poll()}")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line


class GraderPool:
    """Up to `max_workers` grading processes, each doing one grading at a time."""

    def __init__(self, max_workers: int = DEFAULT_WORKERS, start_timeout_s: float = START_TIMEOUT_S) -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be at least 1, got {max_workers}")
        self.max_workers = max_workers
        self.start_timeout_s = start_timeout_s
        self._idle: list[GraderProcess] = []
        self._all: set[GraderProcess] = set()
        self._starting = 0
        self._changed = threading.Condition()

    def grade(self, candidate: str, reference: str, timeout_s: float) -> Verdict:
        """Whether `candidate` equals `reference`, decided within about `timeout_s` (twice, at worst:
        the wait for a free process plus the grading; a process started for it adds its start-up)."""
        process = self._acquire(timeout_s)
        if process is None:
            return Verdict.TIMEOUT
        try:
            reply = process.ask(
                {"candidate": candidate, "reference": reference, "timeout_s": timeout_s}, timeout_s
            )
        except TimeoutError:
            self._discard(process)
            return Verdict.TIMEOUT
        except (GraderExitedError, json.JSONDecodeError):
            self._discard(process)
            return Verdict.FAILED
        self._release(process)
        if "correct" not in reply:
            return Verdict.FAILED
        return Verdict.CORRECT if reply["correct"] else Verdict.WRONG

    def close(self) -> None:
        """Kill every grading process; the pool starts new ones if used again."""
        with self._changed:
            processes, self._all, self._idle = list(self._all), set(), []
            self._changed.notify_all()
        for process in processes:
            process.kill()

    @property
    def size(self) -> int:
        """Grading processes alive now."""
        with self._changed:
            return len(self._all)

    def _acquire(self, wait_s: float) -> GraderProcess | None:
        """An idle process, a new one if the pool has room, or None when none frees up within `wait_s`."""
        deadline = time.monotonic() + wait_s
        with self._changed:
            while not self._idle and len(self._all) + self._starting >= self.max_workers:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._changed.wait(remaining)
            if self._idle:
                return self._idle.pop()
            self._starting += 1
        try:
            process = GraderProcess(self.start_timeout_s)
        finally:
            with self._changed:
                self._starting -= 1
                self._changed.notify()
        with self._changed:
            self._all.add(process)
        return process

    def _release(self, process: GraderProcess) -> None:
        with self._changed:
            if process in self._all:
                self._idle.append(process)
                self._changed.notify()
                return
        process.kill()

    def _discard(self, process: GraderProcess) -> None:
        process.kill()
        with self._changed:
            self._all.discard(process)
            self._changed.notify()


_shared: GraderPool | None = None
_shared_lock = threading.Lock()


def shared_pool() -> GraderPool:
    """This process's grading pool, created on first use and closed at exit."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = GraderPool()
            atexit.register(_shared.close)
        return _shared
