"""The counter env behind a gate that env worker processes stop at, to test a server whose workers are
slow to start, or cannot.

In a `vistarl.services.server.worker_process` process, importing this module waits until the file named by
`VISTARL_TEST_GATE` exists (at most `GATE_WAIT_S`), then raises if the file holds `fail`. Any other
process (the server's own) loads it at once.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from tests.envs.counter import ENV_FACTORY

__all__ = ["ENV_FACTORY"]

GATE_WAIT_S = 60.0


def in_worker_process() -> bool:
    """Whether this process is an env worker (`python -m vistarl.services.server.worker_process`)."""
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    return spec is not None and spec.name == "vistarl.services.server.worker_process"


def wait_at_gate(gate: Path) -> None:
    """Wait until `gate` exists (bounded), then raise if it says `fail`."""
    deadline = time.monotonic() + GATE_WAIT_S
    while not gate.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    if not gate.exists() or gate.read_text() == "fail":
        raise RuntimeError("this env worker was told not to start")


if in_worker_process():
    wait_at_gate(Path(os.environ["VISTARL_TEST_GATE"]))
