"""An env worker process: hosts the envs of some sessions for a server's `ProcessEnvPool`.

    python -m vistarl.services.server.worker_process vistarl.services.sokoban [--max-image-bytes N]
    [--max-image-pixels N]
        [--export-state]

It reads msgpack calls `[call_id, op, args]` from stdin and writes `[call_id, ok, payload]` to stdout,
one call at a time: `payload` is the answer (`[body, state]` for a reset, `[done, body, state]` for a
step, the body for a format, nil for a close or a restore; the state is msgpack bytes with
`--export-state`, else nil), or `[code, message]` when `ok` is false. Its first frame, `[0, true, pid]`,
says the env is loaded. At the end of stdin it answers what it has read, closes its envs and exits.
Anything the env prints goes to stderr, so stdout carries frames only. Ctrl-C is left to the server,
which stops its workers itself.

Calls are answered in arrival order, except that after a reset the steps of other sessions may pass
the next one (`Calls`).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import fcntl
import logging
import os
import select
import signal
import sys
import time
from typing import Any, BinaryIO

import msgpack

from vistarl.clients.protocol import ErrorCode, Observation
from vistarl.httpserver.errors import ServiceError
from vistarl.services.env_api import load_env_factory
from vistarl.services.server.env_calls import EnvHost, guarded, task_from_payload
from vistarl.services.server.gc_tuning import collect_garbage_less_often
from vistarl.services.server.malloc_tuning import keep_freed_memory

READ_CHUNK = 1 << 16
MAX_CALL_BYTES = 1 << 28
PIPE_BYTES = 1 << 20  # Linux's default limit for unprivileged processes (/proc/sys/fs/pipe-max-size)
BUILDS = frozenset({"reset", "restore"})


def answer(host: EnvHost, op: str, args: list[Any]) -> Any:
    """Run one call on `host`; the payload of a successful answer."""
    if op == "step":
        session_id, action, with_message = args
        done, stepped, state = guarded("step", host.step, session_id, action, with_message)
        return [done, stepped.body, state]
    if op == "reset":
        session_id, options, seed, sample, with_message = args
        task = task_from_payload(host.factory, options, seed, sample)
        started, state = guarded("reset", host.start, session_id, task, with_message)
        return [started.body, state]
    if op == "restore":
        session_id, state = args
        return guarded("restore", host.restore, session_id, state)
    if op == "close":
        return guarded("close", host.close, args[0])
    if op == "format":
        return guarded("format", host.format, Observation.model_validate(args[0]))
    raise ValueError(f"unknown env worker call {op!r}")


class Calls:
    """The calls read and not yet answered, in arrival order, except right after a build (`BUILDS`: a
    reset or a restore, several steps' work): then the calls that build nothing and whose session has no
    call ahead of them go first, until they have had as much of the worker's time as that build took.

    A wave of resets (episodes that end together, as a batch truncated at `max_steps` does) then slows
    the steps of the worker's other sessions by about half while it lasts, where arrival order holds up
    every step behind it for all of it; a reset waits for at most one reset's time of such steps; and the
    calls of one session keep their order."""

    def __init__(self) -> None:
        self.queue: collections.deque[Any] = collections.deque()
        self.owed = 0.0  # seconds of the last build not yet given back to other calls

    def add(self, call: Any) -> None:
        """Queue one decoded call frame (a malformed one is left for `answer_one` to refuse)."""
        self.queue.append(call)

    def passable(self) -> bool:
        """Whether a call may go before the one at the head (a build, right after another build)."""
        return self.owed > 0 and _builds(self.queue[0])

    def take(self) -> Any:
        """The next call to answer."""
        passing = self._overtaking() if self.passable() else None
        if passing is None:
            return self.queue.popleft()
        call = self.queue[passing]
        del self.queue[passing]
        return call

    def spent(self, call: Any, seconds: float) -> None:
        """Count the time that answering `call` took."""
        self.owed = seconds if _builds(call) else max(0.0, self.owed - seconds)

    def _overtaking(self) -> int | None:
        """The index of the first call that may go before the build at the head, if any."""
        ahead = set()
        for index, call in enumerate(self.queue):
            session = _session(call)
            if index and not _builds(call) and (session is None or session not in ahead):
                return index
            ahead.add(session)
        return None

    def __bool__(self) -> bool:
        return bool(self.queue)


def _builds(call: Any) -> bool:
    """Whether a call frame builds an env (a reset or a restore)."""
    return isinstance(call, list) and len(call) == 3 and call[1] in BUILDS


def _session(call: Any) -> Any:
    """The session a call frame is about (its first argument), None for a format or a malformed frame."""
    if not (isinstance(call, list) and len(call) == 3 and call[1] != "format"):
        return None
    args = call[2]
    return args[0] if isinstance(args, list) and args else None


def serve(host: EnvHost, calls: int, answers: BinaryIO) -> None:
    """Answer the calls read from file descriptor `calls` until it closes and every call is answered.
    Calls are read when none waits, and also before answering a build that others may pass, so that
    `Calls` sees those that arrived meanwhile."""
    unpacker = msgpack.Unpacker(max_buffer_size=MAX_CALL_BYTES)
    waiting = Calls()
    readable = select.poll()
    readable.register(calls, select.POLLIN)
    reading = True
    while reading or waiting:
        if reading and (not waiting or (waiting.passable() and readable.poll(0))):
            chunk = os.read(calls, READ_CHUNK)
            reading = bool(chunk)
            unpacker.feed(chunk)
            for call in unpacker:
                waiting.add(call)
            continue
        call = waiting.take()
        started = time.perf_counter()
        answers.write(msgpack.packb(answer_one(host, call)))
        answers.flush()
        waiting.spent(call, time.perf_counter() - started)


def answer_one(host: EnvHost, call: Any) -> list[Any]:
    """The answer frame of one call frame `[call_id, op, args]`."""
    call_id, op, args = call
    try:
        return [call_id, True, answer(host, op, args)]
    except ServiceError as exc:
        return [call_id, False, [exc.code.value, exc.message]]
    except (ValueError, TypeError) as exc:  # a malformed call: answer it, keep serving
        return [call_id, False, [ErrorCode.INTERNAL.value, f"bad env worker call {op!r}: {exc}"]]


def widen_pipe(fd: int) -> None:
    """Let the pipe behind `fd` hold `PIPE_BYTES`, so that a large answer (a VSI reset's frames, 80 kB)
    is written at once instead of waiting for the server to drain the default 64 KiB; where that is
    not possible (not Linux, not a pipe, above the system's limit) the pipe stays as it is."""
    with contextlib.suppress(AttributeError, OSError):
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("env", help="import path of the env package (its ENV_FACTORY)")
    parser.add_argument("--max-image-bytes", type=int, default=8 * 1024 * 1024)
    parser.add_argument("--max-image-pixels", type=int, default=4096 * 4096)
    parser.add_argument("--export-state", action="store_true", help="Answer each env's state too.")
    args = parser.parse_args(argv)
    keep_freed_memory()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # stray prints must not corrupt the frames
    widen_pipe(answers.fileno())
    logging.basicConfig(level=logging.INFO, format=f"env worker {os.getpid()}: %(levelname)s %(message)s")
    factory = load_env_factory(args.env)
    factory.preload()
    host = EnvHost(factory, args.max_image_bytes, args.max_image_pixels, args.export_state)
    collect_garbage_less_often()
    answers.write(msgpack.packb([0, True, os.getpid()]))
    answers.flush()
    try:
        serve(host, sys.stdin.fileno(), answers)
    finally:
        host.close_all()


if __name__ == "__main__":
    main()
