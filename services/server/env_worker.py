"""An env worker process: hosts the envs of some sessions for a server's `ProcessEnvPool`.

    python -m services.server.env_worker services.sokoban [--max-image-bytes N] [--max-image-pixels N]
        [--export-state]

It reads msgpack calls `[call_id, op, args]` from stdin and writes `[call_id, ok, payload]` to stdout,
in order, one call at a time: `payload` is the answer (`[body, state]` for a reset, `[done, body, state]`
for a step, the body for a format, nil for a close or a restore; the state is msgpack bytes with
`--export-state`, else nil), or `[code, message]` when `ok` is false. Its first frame, `[0, true, pid]`,
says the env is loaded. At the end of stdin it closes its envs and exits. Anything the env prints goes
to stderr, so stdout carries frames only. Ctrl-C is left to the server, which stops its workers itself.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import logging
import os
import signal
import sys
from typing import Any, BinaryIO

import msgpack

from clients.protocol import ErrorCode, Observation
from services.env_api import load_env_factory
from services.server.env_work import EnvHost, guarded, task_from_payload
from services.server.gc_tuning import collect_garbage_less_often
from serving.errors import ServiceError

READ_CHUNK = 1 << 16
MAX_CALL_BYTES = 1 << 28
PIPE_BYTES = 1 << 20  # Linux's default limit for unprivileged processes (/proc/sys/fs/pipe-max-size)


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


def serve(host: EnvHost, calls: int, answers: BinaryIO) -> None:
    """Answer the calls read from file descriptor `calls` until it closes."""
    unpacker = msgpack.Unpacker(max_buffer_size=MAX_CALL_BYTES)
    while chunk := os.read(calls, READ_CHUNK):
        unpacker.feed(chunk)
        for call_id, op, args in unpacker:
            try:
                frame = [call_id, True, answer(host, op, args)]
            except ServiceError as exc:
                frame = [call_id, False, [exc.code.value, exc.message]]
            except (ValueError, TypeError) as exc:  # a malformed call: answer it, keep serving
                frame = [call_id, False, [ErrorCode.INTERNAL.value, f"bad env worker call {op!r}: {exc}"]]
            answers.write(msgpack.packb(frame))
            answers.flush()


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
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # stray prints must not corrupt the frames
    widen_pipe(answers.fileno())
    logging.basicConfig(level=logging.INFO, format=f"env worker {os.getpid()}: %(levelname)s %(message)s")
    factory = load_env_factory(args.env)
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
