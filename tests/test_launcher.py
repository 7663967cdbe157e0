"""`launcher`: the processes `vistarl up` plans (the compose file's, on this host, reached at the address
they listen on), the lock that keeps a directory to one run, the supervisor that runs them (restarts
within a bound, a run that stops naming what died, stops within the grace periods), and the figures
`vistarl status` derives. The whole system under `vistarl up`, and what its preflight refuses, are
tests/test_up.py and tests/test_up_preflight.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.compose_file import load_services
from tests.servers import wait_until
from vistarl.httpserver.launch import free_port
from vistarl.launcher.lock import DirectoryInUse, RunLock, held_by
from vistarl.launcher.plan import (
    COMPOSE_PORTS,
    SESSIONS_DB,
    STOP_GRACE_S,
    WORKER_SHUTDOWN_GRACE_S,
    PlanError,
    ProcessSpec,
    UpOptions,
    plan_processes,
)
from vistarl.launcher.status import PLAN_FILE, RunStatus, alive, step_figures
from vistarl.launcher.supervisor import PROCESSES_FILE, Supervisor
from vistarl.trainer.config import TrainConfig, load_config

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_SERVICES = {"redis": ("redis",), "env": ("sokoban", "geo3k", "vsi"), "engine": ("engine", "sglang")}
COMPOSE_SERVICES |= {"workers": ("worker",), "trainer": ("trainer", "trainer-gpu")}
"""docker-compose.yml's services that play each part of `vistarl up`'s plan."""
TINY_CONFIG = ROOT / "configs" / "sokoban_tiny.yaml"


def options(tmp_path: Path, model: Path, **fields: object) -> UpOptions:
    """`vistarl up` on the tiny Sokoban config and `model`, writing under `tmp_path`."""
    overrides = (f"model.path={model}", *fields.pop("overrides", ()))  # type: ignore[misc]
    return UpOptions(config=TINY_CONFIG, out=tmp_path / "up", overrides=overrides, **fields)  # type: ignore[arg-type]


def flag(argv: tuple[str, ...], name: str) -> str:
    """The value of `--name=VALUE` or `--name VALUE` in a command line."""
    for index, arg in enumerate(argv):
        if arg.startswith(f"{name}="):
            return arg.split("=", 1)[1]
        if arg == name:
            return argv[index + 1]
    raise AssertionError(f"{name} not in {argv}")


def test_the_plans_ports_and_grace_periods_are_the_compose_files() -> None:
    """plan.py copies them from docker-compose.yml (the wheel ships no compose file): every port it takes
    beyond loopback, and every stop grace period, is the one compose gives that part's services."""
    compose = load_services(ROOT / "docker-compose.yml", {})
    assert COMPOSE_SERVICES.keys() == STOP_GRACE_S.keys() >= COMPOSE_PORTS.keys()
    for part, services in COMPOSE_SERVICES.items():
        for service in services:
            assert compose[service].stop_grace_s == STOP_GRACE_S[part], service
            if part in COMPOSE_PORTS and service != "sglang":  # the gpu profile's SGLang exposes none
                assert compose[service].expose == [COMPOSE_PORTS[part]], service
    for service in ("sokoban", "geo3k", "vsi", "engine", "sglang"):
        port = COMPOSE_PORTS["env" if service not in ("engine", "sglang") else "engine"]
        assert flag(tuple(compose[service].command), "--port") == str(port), service
    for service in ("sokoban", "geo3k", "vsi"):
        store = urlsplit(flag(tuple(compose[service].command), "--session-store"))
        assert (store.port, store.path) == (COMPOSE_PORTS["redis"], f"/{SESSIONS_DB}"), service
    worker = tuple(compose["worker"].command)
    assert flag(worker, "--metrics-port") == str(COMPOSE_PORTS["workers"])
    assert flag(worker, "--shutdown-grace-s") == f"{WORKER_SHUTDOWN_GRACE_S:g}"
    assert urlsplit(flag(worker, "--redis-url")).port == COMPOSE_PORTS["redis"]
    assert urlsplit(flag(worker, "--engine").removeprefix("sglang:")).port == COMPOSE_PORTS["engine"]


def test_the_cpu_plan_is_the_compose_files_services_on_this_hosts_ports(
    tmp_path: Path, tiny_qwen25: Path
) -> None:
    plan = plan_processes(options(tmp_path, tiny_qwen25, workers=2))
    specs = {spec.name: spec for spec in plan.processes}
    assert list(specs) == ["redis", "sokoban", "engine", "worker-0", "worker-1", "trainer"]
    compose = load_services(ROOT / "docker-compose.yml", {})
    for name, service in (
        ("redis", "redis"),
        ("sokoban", "sokoban"),
        ("worker-0", "worker"),
        ("trainer", "trainer"),
    ):
        assert specs[name].stop_grace_s == compose[service].stop_grace_s
    for wanted in ("--appendonly", "--appendfsync", "--maxmemory-policy"):
        assert flag(specs["redis"].argv, wanted) == flag(tuple(compose["redis"].command), wanted)
    worker = specs["worker-0"].argv
    for wanted in ("--shutdown-grace-s", "--namespace"):
        assert wanted in " ".join(worker)
    assert flag(worker, "--shutdown-grace-s") == flag(tuple(compose["worker"].command), "--shutdown-grace-s")
    assert flag(worker, "--engine") == f"sglang:{plan.urls['engine']}"
    assert flag(worker, "--env-url") == f"sokoban={plan.urls['env']}"
    assert flag(worker, "--metrics-port") != flag(specs["worker-1"].argv, "--metrics-port")
    assert flag(specs["sokoban"].argv, "--session-store") == plan.urls["redis"].removesuffix("/0") + "/1"
    assert flag(specs["sokoban"].argv, "--max-sessions") == "256"  # the default: 2 x 8 episodes at once fit
    engine = specs["engine"].argv
    assert "--await-weights" in engine and flag(engine, "--device") == "cpu"
    assert flag(engine, "--max-batch-size") == "16"  # the tiny config's 8 episodes a worker, 2 workers
    assert flag(engine, "--model") == str(tiny_qwen25)
    assert flag(engine, "--prefix-cache-mb") == "8192"  # rollout.prefix_cache_mb
    trainer = specs["trainer"]
    assert trainer.argv[:4] == (sys.executable, "-m", "vistarl.cli.main", "train") and not trainer.restart
    sets = [arg.removeprefix("--set=") for arg in trainer.argv if arg.startswith("--set=")]
    for wanted in (
        "rollout.local_workers=0",
        "sync.mode=nccl",
        f"rollout.engine=sglang:{plan.urls['engine']}",
    ):
        assert wanted in sets
    assert plan.run_dir == (tmp_path / "up" / "run").resolve()
    for name in ("engine", "trainer"):  # on the CPU even on a host with GPUs
        assert specs[name].env == {"CUDA_VISIBLE_DEVICES": ""}


def test_gpus_put_the_trainer_under_torchrun_and_the_engine_on_its_own(
    tmp_path: Path, tiny_qwen25: Path
) -> None:
    plan = plan_processes(options(tmp_path, tiny_qwen25, trainer_gpus=(0, 2), engine_gpus=(1,)))
    specs = {spec.name: spec for spec in plan.processes}
    trainer = specs["trainer"]
    assert trainer.argv[1:3] == ("-m", "torch.distributed.run")
    assert "--nproc-per-node=2" in trainer.argv and "--standalone" in trainer.argv
    assert trainer.env == {"CUDA_VISIBLE_DEVICES": "0,2"}
    assert (
        specs["engine"].env == {"CUDA_VISIBLE_DEVICES": "1"}
        and flag(specs["engine"].argv, "--device") == "cuda"
    )
    assert plan.gpus == (0, 1, 2)


def test_several_engine_gpus_start_an_engine_each_which_the_workers_and_the_trainer_all_reach(
    tmp_path: Path, tiny_qwen25: Path
) -> None:
    plan = plan_processes(options(tmp_path, tiny_qwen25, trainer_gpus=(0,), engine_gpus=(1, 2, 3), workers=2))
    specs = {spec.name: spec for spec in plan.processes}
    engines = [specs[f"engine-{i}"] for i in range(3)]
    assert [e.env for e in engines] == [{"CUDA_VISIBLE_DEVICES": gpu} for gpu in ("1", "2", "3")]
    assert all(flag(e.argv, "--max-batch-size") == "6" for e in engines)  # 16 episodes at once over 3
    urls = [f"http://127.0.0.1:{flag(e.argv, '--port')}" for e in engines]
    assert plan.urls["engine"] == ",".join(urls) and len(set(urls)) == 3
    assert flag(specs["worker-1"].argv, "--engine") == f"sglang:{','.join(urls)}"
    assert f"--set=rollout.engine=sglang:{','.join(urls)}" in specs["trainer"].argv
    on_cpu = plan_processes(options(tmp_path, tiny_qwen25, engines=2))
    assert [s.name for s in on_cpu.processes if s.role == "engine"] == ["engine-0", "engine-1"]


@pytest.mark.parametrize("gpus", [(0,), (0, 1, 2, 3)])
def test_the_same_gpus_for_both_roles_run_the_trainer_colocated_with_its_engines(
    tmp_path: Path, tiny_qwen25: Path, gpus: tuple[int, ...]
) -> None:
    plan = plan_processes(options(tmp_path, tiny_qwen25, trainer_gpus=gpus, engine_gpus=gpus, workers=3))
    assert [spec.name for spec in plan.processes] == ["redis", "sokoban", "trainer"]
    trainer = plan.processes[-1]
    sets = [arg.removeprefix("--set=") for arg in trainer.argv if arg.startswith("--set=")]
    assert {"rollout.engine=hf", "rollout.local_workers=3", f"rollout.queue={plan.urls['redis']}"} <= set(
        sets
    )
    assert not any(s.startswith(("sync.mode", "sync.master_port")) for s in sets)  # pushed in process
    assert f"--nproc-per-node={len(gpus)}" in trainer.argv
    assert trainer.env == {"CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus))}
    assert "engine" not in plan.urls and plan.gpus == gpus


def test_a_host_of_a_larger_run_starts_its_part_and_names_the_rest(tmp_path: Path, tiny_qwen25: Path) -> None:
    trainer_only = options(
        tmp_path,
        tiny_qwen25,
        roles=("trainer",),
        redis_url="redis://node-b:6379/0",
        env_url="http://node-b:8000",
        engine_url="http://node-b:30000",
        trainer_gpus=(0, 1),
        nnodes=2,
        rdzv_endpoint="node-a:29400",
        host="0.0.0.0",
    )
    (trainer,) = plan_processes(trainer_only).processes
    torchrun = ("--nnodes=2", "--node-rank=0", "--master-addr=node-a", "--master-port=29400")
    assert all(arg in trainer.argv for arg in torchrun)
    assert "--set=rollout.engine=sglang:http://node-b:30000" in trainer.argv
    assert not any(
        arg.startswith("--set=sync.master_port") for arg in trainer.argv
    )  # the config's, on every node
    services = options(
        tmp_path, tiny_qwen25, roles=("redis", "env", "engine", "workers"), engine_gpus=(0,), host="0.0.0.0"
    )
    specs = {spec.name: spec for spec in plan_processes(services).processes}
    assert list(specs) == ["redis", "sokoban", "engine", "worker-0"]
    assert flag(specs["redis"].argv, "--port") == "6379" and flag(specs["engine"].argv, "--port") == "30000"
    assert flag(specs["engine"].argv, "--host") == "0.0.0.0"


def trainer_config(plan_specs: tuple[ProcessSpec, ...]) -> TrainConfig:
    """The config the planned trainer runs with: the file and the `--set`s of its command line."""
    (trainer,) = [spec for spec in plan_specs if spec.name == "trainer"]
    sets = [arg.removeprefix("--set=") for arg in trainer.argv if arg.startswith("--set=")]
    return load_config(TINY_CONFIG, sets)


def test_the_env_server_holds_twice_the_episodes_the_workers_run_at_once(
    tmp_path: Path, tiny_qwen25: Path
) -> None:
    """Past its `max_sessions`, an env server answers resets with 503 and they wait: `vistarl up` sizes it
    for every worker's episodes at once, twice over (a restarted worker's sessions live on until they
    expire), and never below the server's default."""
    wide = options(tmp_path, tiny_qwen25, workers=2, overrides=("rollout.concurrency=200",))
    env = next(spec for spec in plan_processes(wide).processes if spec.role == "env")
    assert flag(env.argv, "--max-sessions") == "800"


def test_the_users_sync_mode_wins_over_vistarl_ups_and_the_urls_win_over_the_users(
    tmp_path: Path, tiny_qwen25: Path
) -> None:
    assert trainer_config(plan_processes(options(tmp_path, tiny_qwen25)).processes).sync.mode == "nccl"
    mine = options(tmp_path, tiny_qwen25, overrides=("sync.mode=disk", "rollout.local_workers=3"))
    cfg = trainer_config(plan_processes(mine).processes)
    assert cfg.sync.mode == "disk" and cfg.rollout.local_workers == 0


@pytest.mark.parametrize(
    ("host", "reached", "fixed"),
    [("127.0.0.2", "127.0.0.2", False), ("0.0.0.0", "127.0.0.1", True), ("::1", "[::1]", False)],
)
def test_servers_are_reached_and_probed_at_the_address_they_listen_on(
    tmp_path: Path, tiny_qwen25: Path, host: str, reached: str, fixed: bool
) -> None:
    plan = plan_processes(options(tmp_path, tiny_qwen25, host=host))
    specs = {spec.name: spec for spec in plan.processes}
    for name in ("sokoban", "engine"):
        assert flag(specs[name].argv, "--host") == host
    assert flag(specs["redis"].argv, "--bind") == host
    probes = [spec.ready for spec in plan.processes if spec.ready]
    assert len(probes) == 4 and all(urlsplit(probe).netloc.startswith(f"{reached}:") for probe in probes)
    assert all(urlsplit(url).netloc.startswith(f"{reached}:") for url in plan.urls.values())
    assert (urlsplit(plan.urls["engine"]).port == 30000) == fixed  # the compose file's ports beyond loopback
    assert ("--protected-mode" in specs["redis"].argv) == fixed


def test_a_resumed_run_resumes_its_trainer(tmp_path: Path, tiny_qwen25: Path) -> None:
    urls = {"redis_url": "redis://r:6379/0", "env_url": "http://e:8000", "engine_url": "http://g:30000"}
    (trainer,) = plan_processes(
        options(tmp_path, tiny_qwen25, resume=True, roles=("trainer",), **urls)
    ).processes
    assert trainer.argv[3:4] == ("train",) and "--resume" in trainer.argv


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"roles": ("workers",)}, "workers need redis: give --role redis or --redis-url"),
        (
            {"roles": ("redis", "workers"), "env_url": "http://e:8000"},
            "need engine: give --role engine or --engine-url",
        ),
        ({"trainer_gpus": (0,)}, "name GPUs for both"),
        (
            {"trainer_gpus": (0, 1), "engine_gpus": (1, 2)},
            "GPUs 1 are named for both roles: give the trainer and the engines the same GPUs (colocated)",
        ),
        ({"trainer_gpus": (0,), "engine_gpus": (1, 2), "engines": 3}, "--engines 3 with 2 engine GPUs"),
        (
            {
                "roles": ("trainer",),
                "redis_url": "redis://r",
                "env_url": "http://e",
                "engine_url": "http://g",
                "nnodes": 2,
            },
            "--rdzv-endpoint",
        ),
        ({"overrides": ("rollout.no_such_key=1",)}, "unknown key 'rollout.no_such_key'"),
    ],
)
def test_options_that_make_no_run_are_refused_before_anything_starts(
    tmp_path: Path, tiny_qwen25: Path, fields: dict[str, object], message: str
) -> None:
    with pytest.raises(PlanError, match=message.replace("(", r"\(").replace(")", r"\)")):
        plan_processes(options(tmp_path, tiny_qwen25, **fields))
    assert not (tmp_path / "up" / "logs").exists()


def test_a_missing_checkpoint_or_redis_server_is_named(
    tmp_path: Path, tiny_qwen25: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(PlanError, match="is not a checkpoint directory"):
        plan_processes(options(tmp_path, tmp_path / "nowhere"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(PlanError, match=r"no redis-server on PATH.*--redis-url"):
        plan_processes(options(tmp_path, tiny_qwen25))
    assert (
        plan_processes(options(tmp_path, tiny_qwen25, redis_url="redis://elsewhere:6379/0")).processes[0].name
        == "sokoban"
    )


def python(code: str) -> tuple[str, ...]:
    """A command line that runs `code` in this interpreter."""
    return (sys.executable, "-c", code)


SERVE_HEALTH = """
import http.server, sys
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
"""


def service(name: str, port: int, **fields: object) -> ProcessSpec:
    """A long-lived process that answers its readiness check on `port`."""
    return ProcessSpec(
        name, "env", (*python(SERVE_HEALTH), str(port)), ready=f"http://127.0.0.1:{port}/", **fields
    )  # type: ignore[arg-type]


def supervise(tmp_path: Path, *specs: ProcessSpec, max_restarts: int = 2) -> tuple[Supervisor, list[str]]:
    """A supervisor of `specs` under `tmp_path`, and the list its events are echoed to."""
    events: list[str] = []
    return Supervisor(specs, tmp_path, max_restarts=max_restarts, echo=events.append), events


def test_the_run_ends_with_its_trainer_and_every_service_is_stopped(tmp_path: Path) -> None:
    server = service("env", free_port())
    trainer = ProcessSpec("trainer", "trainer", python("print('trained')"), restart=False)
    supervisor, events = supervise(tmp_path, server, trainer)
    ending = supervisor.run()
    assert (ending.code, ending.reason) == (0, "trainer finished")
    record = json.loads((tmp_path / PROCESSES_FILE).read_text())["processes"]
    assert record["env"]["state"] == "stopped"
    assert (record["trainer"]["state"], record["trainer"]["exit_code"]) == ("exited", 0)
    assert not alive(record["env"]["pid"])
    assert (tmp_path / "logs" / "trainer.log").read_text() == "trained\n"
    assert int((tmp_path / "pids" / "env.pid").read_text()) == record["env"]["pid"]
    assert events[-1] == "stopped env"


def test_a_service_that_keeps_dying_is_restarted_within_the_bound_then_stops_the_run_naming_it(
    tmp_path: Path,
) -> None:
    crashing = ProcessSpec(
        "worker-0", "workers", python("print('no engine at that URL'); raise SystemExit(3)")
    )
    sleeper = ProcessSpec("trainer", "trainer", python("import time; time.sleep(600)"), restart=False)
    supervisor, events = supervise(tmp_path, crashing, sleeper, max_restarts=2)
    ending = supervisor.run()
    assert ending.code == 1
    assert ending.reason.startswith("worker-0 exited with code 3, restarted 2 times (--max-restarts 2)")
    assert ending.reason.endswith("no engine at that URL")
    assert [e for e in events if "restarting" in e] == [
        f"worker-0 exited with code 3: restarting it ({n} of 2)" for n in (1, 2)
    ]
    log = (tmp_path / "logs" / "worker-0.log").read_text()
    assert log.count("no engine at that URL") == 3 and log.count("--- vistarl up: restart") == 2
    record = json.loads((tmp_path / PROCESSES_FILE).read_text())["processes"]
    assert record["worker-0"]["restarts"] == 2 and record["trainer"]["state"] == "stopped"


WAIT_THEN_SERVE = "import os, sys, time\nwhile not os.path.exists(sys.argv[2]):\n    time.sleep(0.05)\n"
TOUCH_THEN_SERVE = "import pathlib, sys\npathlib.Path(sys.argv[2]).touch()\n"


def test_a_parts_processes_start_together(tmp_path: Path) -> None:
    """engine-0 answers only once engine-1 has started: started one after the other, engine-0 would never
    be ready, and the run would stop when its start timeout passed."""
    mark = str(tmp_path / "engine-1-started")
    engines = [
        ProcessSpec(
            f"engine-{index}",
            "engine",
            (*python(code + SERVE_HEALTH), str(port), mark),
            ready=f"http://127.0.0.1:{port}/",
            start_timeout_s=60,
        )
        for index, (code, port) in enumerate(
            [(WAIT_THEN_SERVE, free_port()), (TOUCH_THEN_SERVE, free_port())]
        )
    ]
    trainer = ProcessSpec("trainer", "trainer", python("print('trained')"), restart=False)
    ending = supervise(tmp_path, *engines, trainer, max_restarts=0)[0].run()
    assert (ending.code, ending.reason) == (0, "trainer finished")


def test_a_failed_trainer_ends_the_run_with_its_log(tmp_path: Path) -> None:
    trainer = ProcessSpec(
        "trainer",
        "trainer",
        python("print('training failed: no episode'); raise SystemExit(1)"),
        restart=False,
    )
    ending = supervise(tmp_path, trainer)[0].run()
    assert ending.code == 1 and "trainer exited with code 1" in ending.reason
    assert ending.reason.endswith("training failed: no episode")


def test_a_service_that_never_answers_is_killed_and_counted_as_dead(tmp_path: Path) -> None:
    silent = ProcessSpec(
        "engine",
        "engine",
        python("import time; time.sleep(600)"),
        ready=f"http://127.0.0.1:{free_port()}/",
        start_timeout_s=0.5,
    )
    ending = supervise(tmp_path, silent, max_restarts=1)[0].run()
    assert ending.code == 1
    assert ending.reason.startswith("engine did not answer http://127.0.0.1:")
    assert "restarted once (--max-restarts 1)" in ending.reason
    record = json.loads((tmp_path / PROCESSES_FILE).read_text())["processes"]
    assert not alive(record["engine"]["pid"])


def test_sigterm_stops_every_process_part_by_part_killing_what_outlives_its_grace(tmp_path: Path) -> None:
    stubborn = ProcessSpec(
        "worker-0",
        "workers",
        python("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"),
        stop_grace_s=1.0,
    )
    server = service("sokoban", free_port())
    supervisor, events = supervise(tmp_path, server, stubborn)
    timer = threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    try:
        ending = supervisor.run()
    finally:
        timer.cancel()
    assert (ending.code, ending.reason) == (128 + signal.SIGTERM, "SIGTERM: stopping every process")
    assert events[-2:] == ["stopped worker-0", "stopped sokoban"]  # workers before the env server
    record = json.loads((tmp_path / PROCESSES_FILE).read_text())["processes"]
    assert record["worker-0"]["exit_code"] == -signal.SIGKILL  # it ignored SIGTERM for its grace period
    assert record["sokoban"]["exit_code"] == -signal.SIGTERM
    assert not any(alive(p["pid"]) for p in record.values())


HOLD_LOCK = """
import sys, time
from pathlib import Path
from vistarl.launcher.lock import RunLock
RunLock(Path(sys.argv[1])).acquire()
print("held", flush=True)
time.sleep(600)
"""


def test_a_directory_takes_one_run_and_a_dead_holder_releases_it(tmp_path: Path) -> None:
    assert held_by(tmp_path) is None  # no lock file yet
    with RunLock(tmp_path):
        assert held_by(tmp_path) == os.getpid()
        with pytest.raises(DirectoryInUse, match=rf"in use by a live vistarl up \(pid {os.getpid()}\)"):
            RunLock(tmp_path).acquire()
    assert held_by(tmp_path) is None
    holder = subprocess.Popen(
        [*python(HOLD_LOCK), str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        assert held_by(tmp_path) == holder.pid
        holder.kill()  # SIGKILL: no handler runs, the kernel drops the lock
        holder.wait()
        assert wait_until(lambda: held_by(tmp_path) is None, timeout=5)
    finally:
        holder.kill()
        holder.wait()
    with RunLock(tmp_path):
        assert held_by(tmp_path) == os.getpid()


def test_status_counts_every_failure_kind_per_step_with_the_tries_played_again(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (tmp_path / PLAN_FILE).write_text(json.dumps({"run_dir": str(run_dir), "processes": []}))
    clean = {
        "rollout/status/ABORTED": 0,
        "rollout/status/FAILED": 0,
        "rollout/missing": 0,
        "rollout/stale": 0,
    }
    steps = [
        {"step": 1, "time": 1.0, **clean},
        {"step": 2, "time": 2.0, **clean, "rollout/status/ABORTED": 1, "rollout/status/FAILED": 2,
         "rollout/unusable_tries": 1, "rollout/unusable/ABORTED": 8},
        {"step": 3, "time": 3.0, **clean, "rollout/missing": 3, "rollout/stale": 1,
         "rollout/unusable/missing": 2},
    ]  # fmt: skip
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(step) + "\n" for step in steps))
    run = RunStatus(tmp_path)
    assert run.failures() == [
        {"step": 2, "ABORTED": 9, "FAILED": 2, "missing": 0, "stale": 0, "unusable tries": 1},
        {"step": 3, "ABORTED": 0, "FAILED": 0, "missing": 5, "stale": 1, "unusable tries": 0},
    ]
    assert run.failure_totals() == {"ABORTED": 9, "FAILED": 2, "missing": 5, "stale": 1, "unusable tries": 1}


def test_each_gpus_idle_time_and_peak_memory_come_from_the_samples_of_its_steps() -> None:
    records = [
        {"step": 1, "time": 110.0, "time/step": 10.0, "time/rollout": 6.0},
        {
            "step": 2,
            "time": 114.0,
            "time/step": 4.0,
            "rollout/seconds/generate": 1.5,
            "rollout/seconds/total": 2.0,
        },
    ]
    samples = [
        {"time": t, "gpus": {"0": {"util": util, "mem_mib": mem}, "1": {"util": 100.0, "mem_mib": 500.0}}}
        for t, util, mem in (
            (101.0, 0.0, 1000.0),
            (105.0, 50.0, 3000.0),
            (109.0, 100.0, 2000.0),
            (112.0, 25.0, 1500.0),
        )
    ]
    first, second = step_figures(records, samples)
    assert first["gpu/0/idle_s"] == pytest.approx(10.0 * (1.0 + 0.5 + 0.0) / 3)
    assert (first["gpu/0/peak_mib"], first["gpu/1/idle_s"]) == (3000.0, 0.0)
    assert second["gpu/0/idle_s"] == pytest.approx(4.0 * 0.75) and second["gpu/0/peak_mib"] == 1500.0
    assert (first["share/rollout"], second["share/generate"]) == (0.6, 0.75)
    assert "share/generate" not in first and "share/rollout" not in second
    assert step_figures(records, [])[0] == {**records[0], "share/rollout": 0.6}
