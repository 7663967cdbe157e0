"""Start real servers on loopback, for tests, demos and benchmarks: child processes on free ports
(`vistarl serve`, `redis-server`, any command), waited for within a bound and always stopped."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx

from vistarl.httpserver.launch import free_port, stop_process

__all__ = ["env_server", "redis_server", "running_process", "vistarl_cmd", "wait_http"]


def wait_http(url: str, timeout: float = 30.0, proc: subprocess.Popen[bytes] | None = None) -> None:
    """Poll `url` until it answers 2xx; fail early if `proc` died, and never wait past `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode} before {url} answered")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1.0).is_success:
                return
        time.sleep(0.05)
    raise TimeoutError(f"{url} did not answer within {timeout}s")


@contextlib.contextmanager
def running_process(
    args: Sequence[str],
    ready_url: str | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 60.0,
    cwd: Path | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """Run `args` as a child process in `cwd` (waiting for `ready_url` if given) and stop it afterwards."""
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.Popen(list(args), env=full_env, cwd=cwd, start_new_session=True)
    try:
        if ready_url is not None:
            wait_http(ready_url, timeout=timeout, proc=proc)
        yield proc
    finally:
        stop_process(proc)


def vistarl_cmd(*args: str) -> list[str]:
    """The `vistarl` CLI as a command line, run with this interpreter."""
    return [sys.executable, "-m", "vistarl.cli.main", *args]


@contextlib.contextmanager
def env_server(env_name: str, *flags: str) -> Iterator[str]:
    """`vistarl serve ENV_NAME` on a free loopback port, without a bearer token; yields its base URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = vistarl_cmd("serve", env_name, "--port", str(port), "--log-level", "warning", *flags)
    with running_process(command, ready_url=f"{url}/health", env={"VISTARL_API_TOKEN": ""}):
        yield url


@contextlib.contextmanager
def redis_server(port: int | None = None) -> Iterator[str]:
    """A private `redis-server` on a free port, yielding its URL; falls back to $REDIS_URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        url = os.environ.get("REDIS_URL")
        if not url:
            raise RuntimeError("no redis-server binary and REDIS_URL is not set")
        yield url
        return
    port = port or free_port()
    with tempfile.TemporaryDirectory() as workdir:
        args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        proc = subprocess.Popen([*args, "--dir", workdir], stdout=subprocess.DEVNULL, start_new_session=True)
        try:
            _wait_tcp(port, proc)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            stop_process(proc)


def _wait_tcp(port: int, proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with code {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        time.sleep(0.05)
    raise TimeoutError(f"port {port} did not open within {timeout}s")
