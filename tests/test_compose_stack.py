"""The compose stack's processes, started from docker-compose.yml itself, train on one machine.

`make test` needs no container engine, so each service of the cpu profile that one Sokoban step needs
(redis, sokoban, model, engine, one worker, the trainer) runs its own command from the file, with the
file's environment (bearer auth on), on loopback ports (`tests/compose_file.py` says what is rewritten). The
services start in the order `depends_on` gives, each waited on with its own healthcheck. The trainer
runs twice, one step each, as two `docker compose up` would, against the same long-lived services.
`make compose-test` runs the file itself on a Docker daemon (`tests/test_compose_docker.py`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests.compose_file import Loopback, Service, interpolate, load_services
from tests.machine import outlasting, require
from vistarl.devtools.servers import running_process
from vistarl.services.server.settings import ServerSettings

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "compose-token"
PROFILE = "cpu"
# One small step: 2 episodes of 1 turn, so two runs fit the test's time.
ONE_SMALL_STEP = (
    "--set=train.steps=1",
    "--set=rollout.rollout_batch_size=1",
    "--set=rollout.n_samples_per_prompt=2",
    "--set=rollout.max_turns=1",
    "--set=train.global_batch_size=2",
)
RUN_S = 300.0
"""How long a one-shot service (the model, a trainer run) may take."""
LONG_LIVED = ("redis", "sokoban", "engine", "worker")
"""The services the test starts and waits on, in `depends_on`'s order."""


def healthy_within_s(name: str) -> float:
    """How long `wait_healthy` waits on a service of the file: its healthcheck's interval x retries, and
    the last check's own timeout."""
    check = load_services(ROOT / "docker-compose.yml", {"VISTARL_API_TOKEN": TOKEN})[name].healthcheck
    return 0.0 if check is None else check.interval_s * check.retries + check.timeout_s


@pytest.fixture
def app_dir(tmp_path: Path, tiny_qwen25: Path) -> Path:
    """The image's /app: the configs, and a `runs` volume already holding the tiny checkpoint.

    A `vistarl` on PATH runs this checkout's CLI, as the image's console script does.
    """
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "tiny-qwen2_5_vl").symlink_to(tiny_qwen25)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "vistarl"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m vistarl.cli.main "$@"\n')
    shim.chmod(0o755)
    return tmp_path


def process_env(app_dir: Path, service: Service) -> dict[str, str]:
    """What a service's container sees: its `environment`, with `vistarl` and `python` on PATH."""
    path = os.pathsep.join([str(app_dir / "bin"), str(Path(sys.executable).parent), os.environ["PATH"]])
    return {**os.environ, "PATH": path, "PYTHONPATH": str(ROOT), **service.environment}


def wait_healthy(
    service: Service, loopback: Loopback, env: dict[str, str], proc: subprocess.Popen[bytes]
) -> None:
    """Run the service's healthcheck until it passes, within the time Compose allows (interval x retries)."""
    check = service.healthcheck
    assert check is not None, f"{service.name} has no healthcheck for depends_on to wait on"
    test = loopback.command(service, check.test)
    deadline = time.monotonic() + check.interval_s * check.retries
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{service.name} exited with code {proc.returncode} before it was healthy")
        with contextlib.suppress(subprocess.TimeoutExpired):
            if subprocess.run(test, env=env, capture_output=True, timeout=check.timeout_s).returncode == 0:
                return
        time.sleep(0.5)
    raise TimeoutError(f"{service.name} was not healthy within {check.interval_s * check.retries:.0f} s")


@contextlib.contextmanager
def started(
    service: Service, loopback: Loopback, app_dir: Path, extra: tuple[str, ...] = ()
) -> Iterator[subprocess.Popen[bytes]]:
    """The service's command running on loopback in `app_dir`, healthy if it has a healthcheck."""
    env = process_env(app_dir, service)
    args = [*loopback.command(service, service.command), *extra]
    with running_process(args, env=env, cwd=app_dir) as proc:
        if service.healthcheck is not None:
            wait_healthy(service, loopback, env, proc)
        yield proc


def run_to_completion(service: Service, loopback: Loopback, app_dir: Path, *extra: str) -> str:
    """Run a one-shot service's command to exit 0 and return its output."""
    args = [*loopback.command(service, service.command), *extra]
    done = subprocess.run(
        args, env=process_env(app_dir, service), cwd=app_dir, capture_output=True, text=True, timeout=RUN_S
    )
    assert done.returncode == 0, f"{service.name} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def metric(url: str, line_start: str) -> float:
    """The value of the first Prometheus sample at `url` whose line starts with `line_start`."""
    for line in httpx.get(url, timeout=5).text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.mark.slow  # seven services and two training runs: minutes of CPU
@outlasting(3 * RUN_S, *map(healthy_within_s, LONG_LIVED))  # the model and two trainer runs
def test_the_cpu_profile_trains_twice_through_redis_the_worker_and_the_engine(app_dir: Path) -> None:
    require(
        shutil.which("redis-server") is not None,
        "the redis service runs redis-server: install it (scripts/ensure-redis.sh)",
    )
    services = load_services(ROOT / "docker-compose.yml", {"VISTARL_API_TOKEN": TOKEN})
    for name in ("model", "engine", "trainer"):
        assert services[name].profiles == [PROFILE], f"{name} belongs to the {PROFILE} profile"
    for name in ("redis", "sokoban", "worker"):
        assert services[name].profiles == [], f"{name} runs in every profile"
    loopback = Loopback()
    for name in LONG_LIVED:
        loopback.assign(services[name])
    redis_port = loopback.local("redis", 6379)
    redis_flags = ("--port", str(redis_port), "--bind", "127.0.0.1", "--dir", str(app_dir))
    sokoban = f"http://127.0.0.1:{loopback.local('sokoban', 8000)}"
    worker_metrics = f"http://127.0.0.1:{loopback.local('worker', 9100)}/metrics"

    with contextlib.ExitStack() as stack:
        stack.enter_context(started(services["redis"], loopback, app_dir, redis_flags))
        stack.enter_context(started(services["sokoban"], loopback, app_dir))
        run_to_completion(services["model"], loopback, app_dir)
        stack.enter_context(started(services["engine"], loopback, app_dir))
        stack.enter_context(started(services["worker"], loopback, app_dir))

        trainer = services["trainer"]
        outputs = [run_to_completion(trainer, loopback, app_dir, *ONE_SMALL_STEP) for _ in range(2)]

        done = metric(worker_metrics, "vistarl_worker_episodes_done_total ")
        resets = metric(f"{sokoban}/metrics", "vistarl_env_resets_total ")
        refused = metric(f"{sokoban}/metrics", 'vistarl_env_errors_total{code="unauthorized"}')
        unauthenticated = httpx.post(f"{sokoban}/reset", json={}, timeout=5).status_code

    run_dirs = sorted((app_dir / "runs").glob("sokoban_tiny-*"))
    assert len(run_dirs) == 2, outputs
    for run_dir in run_dirs:
        (record,) = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert record["rollout/episodes"] == 2.0 and record["rollout/missing"] == 0.0
        assert (run_dir / "reward_curve.png").stat().st_size > 0
        assert (run_dir / "checkpoints" / "latest").is_file()
    assert done == 4.0, "every episode went through the worker, none ran in the trainer"
    assert resets == 4.0
    assert refused == 0.0, "the worker sent the bearer token"
    assert unauthenticated == 401


def test_interpolation_follows_compose_and_refuses_forms_it_does_not_read() -> None:
    variables = {"SET": "x", "EMPTY": ""}
    assert interpolate("${SET:-d} ${EMPTY:-d} ${UNSET:-d}", variables) == "x d d"
    assert interpolate("[${EMPTY-d}] ${UNSET-d} ${SET} [${UNSET}]", variables) == "[] d x []"
    assert interpolate("$${SET} costs $$5", variables) == "${SET} costs $5"
    assert interpolate({"k": ["${SET}", 3]}, variables) == {"k": ["x", 3]}
    with pytest.raises(ValueError, match=r"\$\{UNSET:\?required\}"):
        interpolate("${UNSET:?required}", variables)


def flag_seconds(command: list[str], flag: str) -> float:
    """The value of `flag=SECONDS` in a command line."""
    (value,) = [arg.split("=", 1)[1] for arg in command if arg.startswith(f"{flag}=")]
    return float(value)


def test_long_lived_services_restart_and_get_longer_to_stop_than_they_drain() -> None:
    services = load_services(ROOT / "docker-compose.yml", {})
    for name in ("redis", "sokoban", "geo3k", "vsi", "engine", "sglang", "worker"):
        assert services[name].restart == "unless-stopped", f"{name} stays down after a crash"
    for name in ("model", "trainer", "trainer-gpu"):
        assert services[name].restart == "no", f"{name} is a one-shot: a restart would run it again"
    worker = services["worker"]
    assert worker.stop_grace_s > flag_seconds(worker.command, "--shutdown-grace-s")
    drain_s = ServerSettings().shutdown_timeout_s
    for name in ("sokoban", "geo3k", "vsi"):
        assert services[name].stop_grace_s > drain_s, f"{name} is killed before it drains"


def test_sokoban_is_published_on_loopback_unless_asked_and_no_bind_mount_is_made_by_default() -> None:
    raw = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    document = interpolate(raw, {})
    services = document["services"]
    assert services["sokoban"]["ports"] == ["127.0.0.1:8000:8000"]
    opened = interpolate(raw, {"SOKOBAN_PUBLISH": "0.0.0.0"})
    assert opened["services"]["sokoban"]["ports"] == ["0.0.0.0:8000:8000"]
    named = set(document["volumes"])
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            assert source in named, f"{name} mounts {source}, which is not a named volume, by default"
    assert "redis-data:/data" in services["redis"]["volumes"], "the AOF would live in an anonymous volume"
