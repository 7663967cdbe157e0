"""A grading process (`python -m vistarl.services.geo3k.grade_worker`): math-verify behind JSON lines on
stdin/stdout.

It prints `{"ready": true}` once warm (the LaTeX grammar loaded), then answers each request line
`{"candidate": str, "reference": str, "timeout_s": float}` with `{"correct": bool}`, or `{"error": str}`
for a line that is not such a request. It exits at the end of its input, and quietly when its parent
has gone before reading an answer (a process that exits during the pool's warm-up). Each grading also arms
SIGALRM, whose default action ends the process, for one second past the request's timeout: the kernel
stops a grading stuck in C code (a huge integer power holds the GIL, so no Python-level watchdog could
run), even when the parent that would have killed it is gone.
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
from typing import Any

from vistarl.services.geo3k.equivalence import answers_match

ALARM_GRACE_S = 1


def main() -> None:
    """Warm up, announce readiness, then answer requests until stdin closes or nobody reads the answers."""
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    answers_match("1", "1")
    try:
        _reply({"ready": True})
        for line in sys.stdin:
            _reply(_answer(line))
    except BrokenPipeError:  # the parent closed its end: nobody to answer, nothing to report
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit's flush cannot fail
        sys.exit(1)


def _answer(line: str) -> dict[str, Any]:
    """The reply to one request line, computed under the request's alarm."""
    try:
        request = json.loads(line)
        candidate, reference, timeout_s = request["candidate"], request["reference"], request["timeout_s"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        return {"error": f"bad request: {exc}"}
    if not isinstance(candidate, str) or not isinstance(reference, str):
        return {"error": "bad request: candidate and reference must be strings"}
    if not isinstance(timeout_s, (int, float)) or not 0 < timeout_s < 3600:
        return {"error": "bad request: timeout_s must be a number of seconds below 3600"}
    signal.alarm(math.ceil(timeout_s) + ALARM_GRACE_S)
    try:
        return {"correct": answers_match(candidate, reference)}
    finally:
        signal.alarm(0)


def _reply(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
