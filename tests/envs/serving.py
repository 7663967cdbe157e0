"""Run test envs as real `vistarl serve` processes on free loopback ports."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator

from vistarl.devtools.servers import running_process, vistarl_cmd
from vistarl.httpserver.launch import free_port

COUNTER_ENV = "tests.envs.counter"


@contextlib.contextmanager
def served_process(
    name: str, *flags: str, env: dict[str, str] | None = None
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """Serve env `name` with extra CLI `flags` and `VISTARL_*` `env`; yields (base URL, process).

    No bearer token unless `env` sets `VISTARL_API_TOKEN`, whatever the caller's environment holds.
    """
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = vistarl_cmd("serve", name, "--port", str(port), "--log-level", "warning", *flags)
    with running_process(
        args, ready_url=f"{url}/health", env={"VISTARL_API_TOKEN": "", **(env or {})}
    ) as proc:
        yield url, proc


@contextlib.contextmanager
def served(name: str, *flags: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """Like `served_process`, yielding only the base URL."""
    with served_process(name, *flags, env=env) as (url, _):
        yield url


def counter_process(
    *flags: str, env: dict[str, str] | None = None
) -> contextlib.AbstractContextManager[tuple[str, subprocess.Popen[bytes]]]:
    """The counter env as a process: see `served_process`."""
    return served_process(COUNTER_ENV, *flags, env=env)


def counter_server(*flags: str, env: dict[str, str] | None = None) -> contextlib.AbstractContextManager[str]:
    """The counter env's base URL: see `served`."""
    return served(COUNTER_ENV, *flags, env=env)
