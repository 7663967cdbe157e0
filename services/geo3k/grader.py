"""Bounded-time grading: a pool of `vistarl.services.geo3k.grade_worker` processes, each past its deadline
killed.

math-verify can spend unbounded time in sympy (`9^{9^{9}}`), and its SIGALRM timeout only works in a
main thread, while the env runs in server threads, env worker processes and rollout threads. So each
grading goes to a small process over a pipe (JSON lines, no pickle) and the caller waits at most
`timeout_s` for the answer; a process that overruns is killed and replaced on demand, and the grading
is a TIMEOUT verdict (score 0, counted by the env). A grading also waits at most `timeout_s` for a free
process; free processes go to the longest waiter. The pool is shared by every env of this process
(`shared_pool`) and holds up to `max_workers` processes, started in the background when the first env
is created (`warm`), else when a grading needs one. docs/benchmarks.md ("Geo3k") measures the cost.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import enum
import json
import logging
import math
import os
import select
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

START_TIMEOUT_S = 60.0
STOP_GRACE_S = 1.0
READ_CHUNK = 1 << 16
DEFAULT_WORKERS = max(1, min(4, os.cpu_count() or 1))

logger = logging.getLogger(__name__)


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
        command = [sys.executable, "-m", "vistarl.services.geo3k.grade_worker"]
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self.process.stdout is not None
        self._fd = self.process.stdout.fileno()
        self._poller = select.poll()
        self._poller.register(self._fd, select.POLLIN)
        self._buffer = b""
        try:
            ready = json.loads(self._read_line(time.monotonic() + start_timeout_s))
        except (TimeoutError, GraderExitedError, ValueError) as exc:
            self.kill()
            raise GraderStartError(f"the grading process did not start: {exc}") from None
        if ready != {"ready": True}:
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
        """The next output line, waiting no later than `deadline` (monotonic seconds). `poll`, not
        `select`: a busy server's descriptors pass select's limit of 1024."""
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self._poller.poll(math.ceil(remaining * 1000)):
                raise TimeoutError("no answer in time")
            chunk = os.read(self._fd, READ_CHUNK)
            if not chunk:
                raise GraderExitedError(f"the grading process exited with {self.process.poll()}")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line


@dataclass
class _Waiter:
    """A grading waiting for a process: it is handed either an idle process or a free slot to start one."""

    ready: threading.Event = field(default_factory=threading.Event)
    process: GraderProcess | None = None
    may_start: bool = False


class GraderPool:
    """Up to `max_workers` grading processes, each doing one grading at a time, handed out first come,
    first served (a free process goes to the longest waiter, so a busy pool starves no grading)."""

    def __init__(self, max_workers: int = DEFAULT_WORKERS, start_timeout_s: float = START_TIMEOUT_S) -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be at least 1, got {max_workers}")
        self.max_workers = max_workers
        self.start_timeout_s = start_timeout_s
        self._idle: list[GraderProcess] = []
        self._all: set[GraderProcess] = set()
        self._starting = 0
        self._waiters: collections.deque[_Waiter] = collections.deque()
        self._lock = threading.Lock()

    def warm(self) -> None:
        """Start processes for the pool's free slots in background threads: an env calls this when it is
        created, so its first grading (a model turn later) finds a process ready, and a pool that lost
        processes (a start that failed, a grading that timed out, `close`) fills up again."""
        with self._lock:
            slots = max(0, self.max_workers - len(self._all) - self._starting)
            self._starting += slots
        for _ in range(slots):
            threading.Thread(target=self._start_idle, name="geo3k-grader-start", daemon=True).start()

    def grade(self, candidate: str, reference: str, timeout_s: float) -> Verdict:
        """Whether `candidate` equals `reference`, decided within about `timeout_s` (twice, at worst:
        the wait for a free process plus the grading; a process started for it adds its start-up)."""
        process = self._acquire(timeout_s)
        if process is None:
            return Verdict.TIMEOUT
        request = {"candidate": candidate, "reference": reference, "timeout_s": timeout_s}
        try:
            reply = process.ask(request, timeout_s)
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
        with self._lock:
            processes, self._all, self._idle = list(self._all), set(), []
        for process in processes:
            process.kill()

    @property
    def size(self) -> int:
        """Grading processes alive now."""
        with self._lock:
            return len(self._all)

    def _acquire(self, wait_s: float) -> GraderProcess | None:
        """An idle process, a new one if the pool has room, or None when none frees up within `wait_s`."""
        with self._lock:
            if self._idle and not self._waiters:
                return self._idle.pop()
            room = not self._waiters and len(self._all) + self._starting < self.max_workers
            if room:
                self._starting += 1
            else:
                waiter = _Waiter()
                self._waiters.append(waiter)
        if room:
            return self._start()
        waiter.ready.wait(wait_s)
        with self._lock:
            if waiter.process is None and not waiter.may_start:
                self._waiters.remove(waiter)
                return None
        return waiter.process or self._start()

    def _start(self) -> GraderProcess:
        """Start a process in a slot already counted in `_starting`; on failure the slot passes on."""
        try:
            process = GraderProcess(self.start_timeout_s)
        except BaseException:
            with self._lock:
                self._starting -= 1
                self._hand_slot()
            raise
        with self._lock:
            self._starting -= 1
            self._all.add(process)
        return process

    def _start_idle(self) -> None:
        """Start a process in a counted slot and give it out; a failure is only logged (gradings retry)."""
        try:
            process = self._start()
        except Exception:
            logger.exception("a grading process failed to start in the background")
            return
        self._release(process)

    def _release(self, process: GraderProcess) -> None:
        """Give a process back: to the longest waiter, else to the idle list (killed if the pool closed)."""
        with self._lock:
            if process in self._all:
                if self._waiters:
                    waiter = self._waiters.popleft()
                    waiter.process = process
                    waiter.ready.set()
                else:
                    self._idle.append(process)
                return
        process.kill()

    def _discard(self, process: GraderProcess) -> None:
        """Kill a process whose grading failed; its slot goes to the longest waiter."""
        process.kill()
        with self._lock:
            self._all.discard(process)
            self._hand_slot()

    def _hand_slot(self) -> None:
        """With the lock held: let the longest waiter start a process in a free slot."""
        if self._waiters and len(self._all) + self._starting < self.max_workers:
            waiter = self._waiters.popleft()
            waiter.may_start = True
            self._starting += 1
            waiter.ready.set()


_shared: dict[int, GraderPool] = {}
_shared_lock = threading.Lock()


def shared_pool() -> GraderPool:
    """This process's grading pool, created on first use and closed at exit. Keyed by process id: a
    forked child gets its own pool rather than talking over its parent's pipes, and leaves the parent's
    processes alone when it exits."""
    with _shared_lock:
        pool = _shared.get(os.getpid())
        if pool is None:
            pool = _shared[os.getpid()] = GraderPool()
            atexit.register(_close_own, os.getpid(), pool)
        return pool


def _close_own(owner: int, pool: GraderPool) -> None:
    """At exit, close `pool` if this is the process that made it (a forked child inherits the handler)."""
    if os.getpid() == owner:
        pool.close()
