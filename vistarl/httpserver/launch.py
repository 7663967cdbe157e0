"""Run `vistarl serve NAME` as a child process on a free loopback port, and stop it cleanly; or serve an
app on this process's event loop (`serving_in_loop`).

The single-machine stack (`vistarl train`), the scripted demo and the tests all start env servers
this way, so production's HTTP path is what they exercise. Under torchrun each rank but the first
serves its embedded engine in its own loop (`vistarl.trainer.run.rank_engines`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import uvicorn

SERVER_START_TIMEOUT_S = 60.0
SERVER_STOP_GRACE_S = 10.0


def free_port() -> int:
    """Ask the kernel for a free TCP port on loopback."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_healthy(
    url: str,
    proc: subprocess.Popen[bytes],
    log_path: Path | None = None,
    timeout: float = SERVER_START_TIMEOUT_S,
) -> None:
    """Poll `url/health` until it answers, `timeout` seconds at most; fail early, quoting the log, if the
    process dies first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace")[-2000:] if log_path else ""
            raise RuntimeError(f"the server exited with code {proc.returncode}:\n{tail}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=1.0).is_success:
                return
        time.sleep(0.1)
    raise TimeoutError(f"the server at {url} was not healthy within {timeout:.0f} s")


def stop_process(proc: subprocess.Popen[bytes], grace: float = SERVER_STOP_GRACE_S) -> None:
    """SIGTERM the process group, then SIGKILL it if it outlives `grace` seconds."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=grace)


@contextlib.contextmanager
def serve_env(name: str, log_path: Path, port: int | None = None) -> Iterator[str]:
    """Run `vistarl serve NAME` until the block ends and yield its URL, once `/health` answers.

    The server's output goes to `log_path`; `port` defaults to a free one.
    """
    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    command = [
        sys.executable,
        "-m",
        "vistarl.cli.main",
        "serve",
        name,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as sink:
        proc = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_healthy(url, proc, log_path)
        yield url
    finally:
        stop_process(proc)


@contextlib.asynccontextmanager
async def serving_in_loop(
    app: Any, host: str = "127.0.0.1", port: int = 0, **config: Any
) -> AsyncIterator[str]:
    """Serve the ASGI `app` with uvicorn on the running event loop, on `host`'s `port` (0: a free one),
    until the block ends; yields its URL once it listens. `config` goes to `uvicorn.Config` (`log_level`,
    ...)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    server = uvicorn.Server(uvicorn.Config(app, **config))
    task = asyncio.create_task(server.serve(sockets=[sock]), name="vistarl-httpserver")
    try:
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while not server.started:
            if task.done():
                raise RuntimeError(f"the server on {host} stopped before it listened: {task.exception()!r}")
            if time.monotonic() >= deadline:
                raise TimeoutError(f"the server on {host} did not listen within {SERVER_START_TIMEOUT_S:g} s")
            await asyncio.sleep(0.02)
        yield f"http://{host}:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        with contextlib.suppress(asyncio.TimeoutError, TimeoutError):
            await asyncio.wait_for(task, SERVER_STOP_GRACE_S)
        sock.close()
