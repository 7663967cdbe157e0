"""What tests read of running servers: their env worker processes, their metrics, and a condition polled
within a bound. Starting the servers is `vistarl/devtools/servers.py`'s job."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import httpx

__all__ = ["children", "metric", "wait_until"]


def children(pid: int) -> list[int]:
    """The child processes of `pid` (a server's env workers), from /proc."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(child) for child in (task / "children").read_text().split()]
    return found


def wait_until(condition: Callable[[], bool], timeout: float = 20.0) -> bool:
    """Poll `condition` until it holds or `timeout` seconds pass; whether it held."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def metric(url: str, name: str) -> float:
    """The unlabelled sample `name` of the server at `url`, from its `/metrics`."""
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    raise AssertionError(f"{url}/metrics has no sample {name}")
