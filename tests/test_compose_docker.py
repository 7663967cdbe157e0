"""`docker compose up` for real, on a Docker daemon: the cpu profile trains through a killed worker and a
killed env server (`make compose-test`; docs/deploy.md, "The real compose test").

It builds the image, starts the stack with the file as users run it (bearer auth on), checks that each
env server's image serves (`/ready`, and a VSI reset that renders a frame), waits for the trainer's
first step, then SIGKILLs one worker and the Sokoban server, as a crash would. Their `restart:` policy
brings both back; the killed worker's jobs are reclaimed after their lease and the server's sessions
resume from Redis. The run must finish its steps with exit 0, every episode of every step played, and
no dead letter. `down -v` ends it, however it went.

Where no image registry answers, `scripts/standin-images.sh` builds the base images from Debian
packages. The build's pip installs from a local index (TORCH_INDEX and PIP_INDEX_URL) of wheels that
pip fetched here as this machine configures it: torch is its own CPU wheel. Under `make test` this
file is skipped: it needs a Docker daemon and minutes.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import http.server
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "compose-test-token"
STEPS = 5  # configs/sokoban_tiny.yaml's train.steps
EPISODES_PER_STEP = 8  # its rollout_batch_size x n_samples_per_prompt
ENV_SERVERS = ("sokoban", "geo3k", "vsi")
OFFICIAL = {"PYTHON_IMAGE": "python:3.11-slim", "REDIS_IMAGE": "redis:7.4-alpine"}
TORCH = "torch==2.13.0"  # the Dockerfile's TORCH_VERSION
INDEX_PORT = int(os.environ.get("VISTARL_INDEX_PORT", "18661"))  # where the build finds the wheels
WHEELS = Path(os.environ.get("STANDIN_CACHE", "/var/cache/vistarl-standin")) / "wheels"

pytestmark = pytest.mark.skipif(
    os.environ.get("VISTARL_COMPOSE_TEST") != "1",
    reason="needs a Docker daemon and minutes: run `make compose-test`",
)


def sh(*args: str, timeout: float = 120, env: dict[str, str] | None = None, check: bool = True) -> str:
    """Run a command here and return its stdout; a failure raises with its output."""
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    if check and done.returncode != 0:
        output = f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
        raise RuntimeError(f"{' '.join(args)} exited {done.returncode}:\n{output}")
    return done.stdout


def base_images() -> dict[str, str]:
    """The official base images where they can be had, else the Debian-built stand-ins."""
    if all(sh("docker", "pull", "-q", image, timeout=120, check=False) for image in OFFICIAL.values()):
        return dict(OFFICIAL)
    print("no image registry answers: using stand-in base images built from Debian packages")
    lines = sh("bash", "scripts/standin-images.sh", timeout=1800).splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


def wheel_index() -> Path:
    """A PEP 503 index of every wheel the image installs, fetched by pip as configured on this machine:
    the torch CPU wheel it provides, setuptools for the build, and the project's dependencies.

    The build's pip then needs no network of its own (nor this network's certificates). The wheels are
    fetched again only when pyproject.toml or the requirements change.
    """
    flat = WHEELS / "files"
    stamp = WHEELS / "requirements.sha256"
    # pip evaluates markers for this interpreter; the stand-in's Python (Debian's 3.11.2) also needs
    # what redis asks for below 3.11.3.
    pinned = (TORCH, "setuptools>=77", "async-timeout>=4.0.3")
    wanted = hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + repr(pinned).encode()).hexdigest()
    if not stamp.is_file() or stamp.read_text() != wanted:
        flat.mkdir(parents=True, exist_ok=True)
        pip = (sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "-d", str(flat))
        sh(*pip, *pinned, f"{ROOT}[server,train]", timeout=1800)
        stamp.write_text(wanted)
    simple = WHEELS / "simple"
    for wheel in flat.glob("*.whl"):
        project = re.sub(r"[-_.]+", "-", wheel.name.split("-")[0]).lower()
        link = simple / project / wheel.name
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink():
            link.symlink_to(wheel)
    return simple


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    """Serves files without a log line per request."""

    def log_message(self, format: str, *args: object) -> None:
        """Log nothing."""


@contextlib.contextmanager
def served(directory: Path) -> Iterator[str]:
    """`directory` over HTTP on loopback (its listings are a simple index); yields the URL.

    The port is fixed (INDEX_PORT): the URL goes into build arguments, whose values are part of the
    build cache's keys, so a new port each run would rebuild every layer after them.
    """
    handler = functools.partial(_QuietHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", INDEX_PORT), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{INDEX_PORT}/"
    finally:
        server.shutdown()
        server.server_close()


def build(images: dict[str, str]) -> float:
    """Build vistarl:latest as the compose file does, on the host network (to reach the local index)."""
    started = time.monotonic()
    with served(wheel_index()) as index:
        sh(
            "nice", "-n", "10", "docker", "build", "--network", "host", "-t", "vistarl:latest",
            "--build-arg", f"BASE_IMAGE={images['PYTHON_IMAGE']}",
            "--build-arg", f"TORCH_INDEX={index}", "--build-arg", f"PIP_INDEX_URL={index}", ".",
            timeout=3600,
        )  # fmt: skip
    return time.monotonic() - started


class Stack:
    """`docker compose` on this checkout's file, with the test's variables."""

    def __init__(self, images: dict[str, str]) -> None:
        self.env = {**os.environ, **images, "VISTARL_API_TOKEN": TOKEN, "COMPOSE_PROFILES": "cpu"}

    def compose(self, *args: str, timeout: float = 120, check: bool = True) -> str:
        return sh("docker", "compose", *args, timeout=timeout, env=self.env, check=check)

    def container(self, service: str, index: int = 0) -> str:
        """The id of one container of `service` (running or exited)."""
        ids = self.compose("ps", "-aq", service).split()
        assert len(ids) > index, f"no container {index} of {service}"
        return sorted(ids)[index]

    def inspect(self, container: str, template: str) -> str:
        return sh("docker", "inspect", "-f", template, container).strip()

    def crash(self, container: str) -> int:
        """SIGKILL the container's main process from the host, as a crash would; returns its restart count."""
        restarts = int(self.inspect(container, "{{.RestartCount}}"))
        os.kill(int(self.inspect(container, "{{.State.Pid}}")), signal.SIGKILL)
        return restarts

    def wait_restarted(self, container: str, restarts: int, timeout_s: float) -> float:
        """Seconds until Docker's restart policy has the crashed container running again."""
        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            state = self.inspect(container, "{{.RestartCount}} {{.State.Running}}")
            if int(state.split()[0]) > restarts and state.endswith("true"):
                return time.monotonic() - started
            time.sleep(0.5)
        raise TimeoutError(f"{container} was not restarted within {timeout_s:g} s (restart policy)")

    def records(self) -> list[dict[str, float]]:
        """The trainer's metrics.jsonl records, read from the `runs` volume through an env server."""
        out = self.compose(
            "exec", "-T", "geo3k", "sh", "-c", "cat runs/sokoban_tiny-*/metrics.jsonl 2>/dev/null || true"
        )
        return [json.loads(line) for line in out.splitlines() if line.strip()]


PROBE = """
import httpx, sys
name, token = sys.argv[1], sys.argv[2]
base = "http://127.0.0.1:8000"
ready = httpx.get(base + "/ready", timeout=30)
assert ready.status_code == 200, (name, ready.status_code, ready.text)
reset = httpx.post(base + "/reset", json={}, headers={"Authorization": "Bearer " + token}, timeout=120)
assert reset.status_code == 200, (name, reset.status_code, reset.text[:500])
images = reset.json()["observation"]["images"]
assert name != "vsi" or (images and images[0].startswith("data:image/")), "vsi rendered no frame"
print(name, "ready; reset gave", len(images), "image(s)")
"""


def wait_for(what: str, predicate: Callable[[], object], timeout_s: float) -> None:
    """Return once `predicate()` is true; raise after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(2)
    raise TimeoutError(f"{what} did not happen within {timeout_s:g} s")


def test_compose_up_trains_through_a_crashed_worker_and_env_server() -> None:
    began = time.monotonic()
    images = base_images()
    build_s = build(images)
    stack = Stack(images)
    models_before = (ROOT / "models").exists()
    stack.compose("down", "-v", "--remove-orphans", timeout=300)
    try:
        up = time.monotonic()
        stack.compose("up", "-d", "--no-build", timeout=600)
        for server in ENV_SERVERS:
            probe = ("exec", "-T", server, "python", "-c", PROBE, server, TOKEN)
            print(stack.compose(*probe, timeout=180).strip())
        wait_for("the trainer's first step", stack.records, 420)
        first_step_s = time.monotonic() - up

        worker = stack.container("worker", 0)
        sokoban = stack.container("sokoban")
        worker_restarts = stack.crash(worker)
        time.sleep(3)
        sokoban_restarts = stack.crash(sokoban)
        sokoban_back_s = stack.wait_restarted(sokoban, sokoban_restarts, 60)
        stack.wait_restarted(worker, worker_restarts, 60)

        trainer = stack.container("trainer")
        exit_code = int(sh("docker", "wait", trainer, timeout=600).strip())
        logs = stack.compose("logs", "--no-color", "trainer", check=False)
        assert exit_code == 0, f"the trainer exited {exit_code}:\n{logs[-6000:]}"
        records = stack.records()
        queue = json.loads(
            stack.compose(
                "exec", "-T", "worker", "vistarl", "queue", "stats", "--json",
                "--redis-url", "redis://redis:6379/0", "--namespace", "compose",
            )
        )  # fmt: skip
    finally:
        stack.compose("down", "-v", "--remove-orphans", timeout=300, check=False)

    assert [int(r["step"]) for r in records] == list(range(1, STEPS + 1)), logs[-6000:]
    lost = {
        "missing": sum(r["rollout/missing"] for r in records),
        "FAILED": sum(r.get("rollout/status/FAILED", 0.0) for r in records),
        "ABORTED": sum(r.get("rollout/status/ABORTED", 0.0) for r in records),
        "dead letters": queue["dead"],
    }
    print(f"build: {build_s:.0f} s; up -> first step: {first_step_s:.0f} s")
    print(f"sokoban restarted by its policy {sokoban_back_s:.1f} s after the kill")
    print("step times (s): " + ", ".join(f"{r['time/step']:.0f}" for r in records))
    print(f"lost to the kills: {lost}; whole test {time.monotonic() - began:.0f} s")
    assert all(r["rollout/episodes"] == EPISODES_PER_STEP for r in records), records
    assert lost == {"missing": 0.0, "FAILED": 0.0, "ABORTED": 0.0, "dead letters": 0}, lost
    assert models_before or not (ROOT / "models").exists(), "the cpu profile left ./models in the checkout"
