"""Run the counter test env as a real `vistarl serve` process on a free loopback port."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator

from tests.servers import free_port, running_process, vistarl_cmd

COUNTER_ENV = "tests.envs.counter"


@contextlib.contextmanager
def counter_process(
    *flags: str, env: dict[str, str] | None = None
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """Serve the counter env with extra CLI `flags` and `VISTARL_*` `env`; yields (base URL, process).

    No bearer token unless `env` sets `VISTARL_API_TOKEN`, whatever the caller's environment holds.
    """
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = vistarl_cmd("serve", COUNTER_ENV, "--port", str(port), "--log-level", "warning", *flags)
    with running_process(
        args, ready_url=f"{url}/health", env={"VISTARL_API_TOKEN": "", **(env or {})}
    ) as proc:
        yield url, proc


@contextlib.contextmanager
def counter_server(*flags: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """Like `counter_process`, yielding only the base URL."""
    with counter_process(*flags, env=env) as (url, _):
        yield url
