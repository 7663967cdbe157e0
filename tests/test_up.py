"""`vistarl up` on the CPU: the tiny Sokoban config trained by Redis, the env server, the engine, a rollout
worker and the trainer, each a process of its own. Its engine is SIGKILLed mid-run: the run finishes,
the restarted engine is pushed the trainer's weights before it answers any generation, and no episode
from its starting weights is trained on. `vistarl status` reads the run back, counting the episodes the
kill aborted. Two `--role` hosts on loopback addresses other than 127.0.0.1 (the Slurm example's layout
on one machine) train together; a second run into a live directory is refused, `vistarl down` stops the
trainer with a checkpoint of its last step, and `--resume` continues it to its last step. A process that
keeps dying stops the run, and SIGTERM stops a detached one, both with real processes of `vistarl up`
(the supervisor's own cases are tests/test_launcher.py; what the preflight refuses,
tests/test_up_preflight.py). The same with two engines, one of them killed: both get every push, and the
other serves meanwhile. The run scripts bring a run up this way when given a checkpoint, colocated when
the trainer and the engine get the same GPUs."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from tests.machine import outlasting, require
from tests.servers import wait_until
from vistarl.devtools.servers import vistarl_cmd
from vistarl.httpserver.launch import stop_process
from vistarl.launcher.plan import UpOptions, plan_processes
from vistarl.launcher.status import alive

ROOT = Path(__file__).resolve().parents[1]
TINY_CONFIG = str(ROOT / "configs" / "sokoban_tiny.yaml")
STEPS = 3
FIRST_STEP_S = 400.0
"""How long a run may take to its first step's metrics."""
RUN_S = 600.0
"""How long `vistarl up` may take to end on its own."""
STATUS_S = 120.0
"""How long `vistarl status` may take."""
DETACH_S = 60.0
"""How long `vistarl up --detach` may take to return."""
START_S = 120.0
"""How long `vistarl up`'s processes may take to run, detached."""
STOP_S = 10 + 20 + 5
"""How long a SIGTERMed `vistarl up` may take to stop: Redis's and the env server's grace, and a margin."""
SMALL_RUN = {
    "train.steps": STEPS,
    "rollout.rollout_batch_size": 1,
    "rollout.n_samples_per_prompt": 4,
    "rollout.max_turns": 2,
}
"""Three steps of four episodes of two turns: the run outlives the kill within a minute of CPU."""


def up(out: Path, *flags: str) -> subprocess.Popen[str]:
    """`vistarl up --config configs/sokoban_tiny.yaml --out OUT FLAGS...`, its output piped."""
    require(shutil.which("redis-server") is not None, "vistarl up starts redis-server: install it")
    args = vistarl_cmd("up", "--config", TINY_CONFIG, "--out", str(out), *flags)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "VISTARL_ENV_WORKERS": "0"}  # envs in the server's threads
    return subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
    )


def recorded(out: Path) -> dict[str, dict[str, object]]:
    """The supervisor's record of each process."""
    return json.loads((out / "processes.json").read_text())["processes"]  # type: ignore[no-any-return]


def status_of(out: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """`vistarl status OUT FLAGS...`, on a console wide enough that rich wraps no table."""
    wide = {**os.environ, "COLUMNS": "200"}  # rich's tables wrap at 80 columns off a terminal
    done = subprocess.run(
        vistarl_cmd("status", str(out), *flags), capture_output=True, text=True, timeout=STATUS_S, env=wide
    )
    assert done.returncode == 0, done.stderr
    return done


def aborted_in_log(trainer_log: str) -> int:
    """The ABORTED episodes the trainer's notes name: of tries played again, and of the steps trained."""
    replayed = re.findall(r"nothing to learn from \((\d+) ABORTED", trainer_log)
    trained = re.findall(r"(\d+) of \d+ episodes ABORTED", trainer_log)
    return sum(int(n) for n in replayed + trained)


def killed_mid_run(out: Path, engine: str, *flags: str) -> str:
    """`vistarl up` of `SMALL_RUN` with one worker and `flags`, its process `engine` SIGKILLed once the first
    step is logged; what it printed, once it finished (exiting 0)."""
    sets = [f"--set={key}={value}" for key, value in SMALL_RUN.items()]
    run = up(out, "--workers", "1", *flags, *sets)
    metrics = out / "run" / "metrics.jsonl"
    try:
        assert wait_until(lambda: metrics.is_file() and metrics.stat().st_size > 0, timeout=FIRST_STEP_S), (
            "no step"
        )
        os.kill(int((out / "pids" / f"{engine}.pid").read_text()), signal.SIGKILL)
        output, _ = run.communicate(timeout=RUN_S)
    finally:
        stop_process(run)  # type: ignore[arg-type]
    assert run.returncode == 0, output
    return output


@outlasting(FIRST_STEP_S, RUN_S, 2 * STATUS_S)
def test_a_run_outlives_its_engine_killed_mid_run_and_trains_on_no_stale_episode(
    tmp_path: Path, tiny_qwen25: Path
) -> None:
    out = tmp_path / "up"
    output = killed_mid_run(out, "engine", f"--set=model.path={tiny_qwen25}")
    metrics = out / "run" / "metrics.jsonl"
    assert "engine exited with code -9: restarting it (1 of 3)" in output
    assert output.rstrip().endswith("vistarl up: trainer finished")

    trainer_log = " ".join((out / "logs" / "trainer.log").read_text().split())  # the console wraps lines
    repush = (
        r"the engine serves weight version '\w+', not the trainer's \d+ \(it restarted\): pushing version"
    )
    assert re.search(repush, trainer_log), trainer_log
    restarted = (out / "logs" / "engine.log").read_text().split("--- vistarl up: restart 1 at")[1]
    first_push = restarted.index('"POST /update_weights_from_distributed HTTP/1.1" 200')
    assert '"POST /generate' not in restarted[:first_push], "the restarted engine generated before its push"
    assert '"POST /generate HTTP/1.1" 200' in restarted[first_push:], "the later steps played on it"

    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    for record in records:  # no episode of the engine's starting weights was filed, none went missing
        assert (record["rollout/stale"], record["rollout/missing"], record["rollout/policy_lag"]) == (0, 0, 0)
        assert record["train/trajectories"] > 0  # a try whose episodes the kill aborted is played again
    processes = recorded(out)
    assert [processes[name]["restarts"] for name in ("redis", "sokoban", "engine", "worker-0")] == [
        0,
        0,
        1,
        0,
    ]
    assert not any(alive(p["pid"]) for p in processes.values())

    status = status_of(out)
    assert f"last step: {STEPS}," in status.stdout and "vistarl up is not running" in status.stdout
    assert re.search(r"│ engine\s+│ engine\s+│ \d+\s+│ stopped\s+│ 1 ", status.stdout), status.stdout
    for label in ("update (s)", "weight sync (s)", "waiting in the queue, per episode (s)", "episodes/s"):
        assert label in status.stdout
    aborted = aborted_in_log(trainer_log)  # the episodes the kill cut, as the trainer logged them
    assert aborted > 0, trainer_log
    in_all = re.search(r"│ in all\s+│\s+(\d+) │", status.stdout)  # the failures' ABORTED column
    assert in_all is not None and int(in_all[1]) == aborted, status.stdout
    figures = json.loads(status_of(out, "--json").stdout)
    assert [s["step"] for s in figures["steps"]] == [r["step"] for r in records]
    assert {p["name"]: p["state"] for p in figures["processes"]}["trainer"] == "exited"
    assert sum(row["ABORTED"] for row in figures["failures"]) == aborted


def served_versions(log: str) -> list[int]:
    """The weight versions an engine's log says it loaded, in order."""
    return [int(version) for version in re.findall(r"serving weight version (\d+)", log)]


@outlasting(FIRST_STEP_S, RUN_S)
def test_two_engines_get_every_push_and_the_run_outlives_one_killed_mid_run(
    tmp_path: Path, tiny_qwen25: Path
) -> None:
    out = tmp_path / "up"
    output = killed_mid_run(out, "engine-1", "--engines", "2", f"--set=model.path={tiny_qwen25}")
    metrics = out / "run" / "metrics.jsonl"
    assert "engine-1 exited with code -9: restarting it (1 of 3)" in output
    trainer_log = " ".join((out / "logs" / "trainer.log").read_text().split())
    repush = r"engine 1 of 2 serves weight version '\w+', not the trainer's \d+ \(it restarted\): pushing "
    repush += r"version (\d+)"
    match = re.search(repush, trainer_log)
    assert match, trainer_log
    survivor = served_versions((out / "logs" / "engine-0.log").read_text())
    assert sorted(set(survivor)) == list(range(STEPS + 1)), "engine 0 loaded every version"
    before, after = (out / "logs" / "engine-1.log").read_text().split("--- vistarl up: restart 1 at")
    assert served_versions(before) == sorted(served_versions(before))
    restarted = served_versions(after)
    assert restarted[0] == int(match[1]) and sorted(set(restarted)) == list(range(restarted[0], STEPS + 1))
    first_push = after.index("serving weight version")
    assert '"POST /generate' not in after[:first_push], "the restarted engine generated before its push"
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    for record in records:  # no episode of stale weights was filed, none went missing
        assert (record["rollout/stale"], record["rollout/missing"], record["rollout/policy_lag"]) == (0, 0, 0)
        assert record["train/trajectories"] > 0
    for name in ("engine-0", "engine-1"):  # both served the workers' episodes
        assert '"POST /generate HTTP/1.1" 200' in (out / "logs" / f"{name}.log").read_text()
    processes = recorded(out)
    assert [processes[name]["restarts"] for name in ("engine-0", "engine-1", "worker-0")] == [0, 1, 0]
    assert not any(alive(p["pid"]) for p in processes.values())


def urls_of(out: Path) -> dict[str, str]:
    """The URLs of the parts a `vistarl up` directory's run started, from its up.json."""
    return json.loads((out / "up.json").read_text())["urls"]  # type: ignore[no-any-return]


def finish(run: subprocess.Popen[str], timeout: float) -> str:
    """Wait for a `vistarl up` to exit (killing it, and its session, past `timeout`); its output."""
    try:
        output, _ = run.communicate(timeout=timeout)
    finally:
        stop_process(run)  # type: ignore[arg-type]
    return output


def refused(out: Path, *flags: str) -> str:
    """A `vistarl up` into `out` that the preflight refuses (exit 2); its one line."""
    run = up(out, *flags)
    output = finish(run, 60)
    assert run.returncode == 2 and len(output.splitlines()) == 1, output
    return output.strip()


@pytest.mark.timeout(660)
def test_two_role_hosts_on_another_loopback_address_train_stop_with_a_checkpoint_and_resume(
    tmp_path: Path, tiny_qwen25: Path
) -> None:
    """The Slurm example's layout on one machine: a services host (Redis, the env server, the engine, a
    worker) and a trainer host, each a `vistarl up --role ...` listening on 127.0.0.2."""
    services, trainer = tmp_path / "services", tmp_path / "trainer"
    model = f"--set=model.path={tiny_qwen25}"
    roles = ("--role", "redis", "--role", "env", "--role", "engine", "--role", "workers")
    served = up(services, *roles, "--workers", "1", "--host", "127.0.0.2", model)
    try:
        assert wait_until(
            lambda: (
                (services / "processes.json").is_file()
                and {p["state"] for p in recorded(services).values()} == {"running"}
            ),
            timeout=240,
        ), "the services did not start"
        urls = urls_of(services)
        assert all(re.match(r"\w+://127\.0\.0\.2:\d+", url) for url in urls.values()), urls
        steps = 4
        sets = [f"--set={key}={value}" for key, value in {**SMALL_RUN, "train.steps": steps}.items()]
        flags = (
            "--role", "trainer", "--host", "127.0.0.2", "--redis-url", urls["redis"],
            "--env-url", urls["env"], "--engine-url", urls["engine"], model, *sets,
        )  # fmt: skip
        training = up(trainer, *flags)
        pid_file = trainer / "pids" / "trainer.pid"
        assert wait_until(lambda: pid_file.is_file() and pid_file.stat().st_size > 0, timeout=240)
        pids = pid_file.read_text()
        for live in (trainer, services):  # a second run into a live directory: refused, the first goes on
            assert re.fullmatch(
                r"vistarl up: \S+ is in use by a live vistarl up \(pid \d+\): .*", refused(live, *flags)
            )
        assert pid_file.read_text() == pids and training.poll() is None
        metrics = trainer / "run" / "metrics.jsonl"
        assert wait_until(lambda: metrics.is_file() and metrics.stat().st_size > 0, timeout=240), "no step"

        down = subprocess.run(vistarl_cmd("down", str(trainer)), capture_output=True, text=True, timeout=120)
        assert down.returncode == 0 and "stopped" in down.stdout, down.stdout + down.stderr
        assert finish(training, 60) and training.returncode == 128 + signal.SIGTERM
        trained = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
        last = trained[-1]
        assert trained == list(range(1, last + 1)) and last < steps, trained  # stopped mid-run
        assert (trainer / "run" / "checkpoints" / "latest").read_text().strip() == f"step-{last:06d}"
        log = " ".join((trainer / "logs" / "trainer.log").read_text().split())
        assert f"stopped after step {last} (SIGTERM)" in log

        earlier = r"vistarl up: \S+ holds an earlier run \(its up.json\): continue it with --resume.*"
        assert re.fullmatch(earlier, refused(trainer, *flags))
        resumed = up(trainer, *flags, "--resume")
        output = finish(resumed, 240)
        assert resumed.returncode == 0 and output.rstrip().endswith("vistarl up: trainer finished"), output
        assert f"resuming after step {last}" in (trainer / "logs" / "trainer.log").read_text()
        assert [json.loads(line)["step"] for line in metrics.read_text().splitlines()] == list(
            range(1, steps + 1)
        )

        down = subprocess.run(vistarl_cmd("down", str(services)), capture_output=True, text=True, timeout=150)
        assert down.returncode == 0, down.stdout + down.stderr
        finish(served, 60)
    finally:
        stop_process(served)  # type: ignore[arg-type]
    assert served.returncode == 128 + signal.SIGTERM
    processes = recorded(services)
    assert {(p["state"], p["restarts"]) for p in processes.values()} == {
        ("stopped", 0)
    }  # unharmed throughout
    assert not any(alive(p["pid"]) for p in processes.values())


@outlasting(RUN_S)
def test_a_process_that_keeps_dying_stops_the_run_naming_it_with_its_log(tmp_path: Path) -> None:
    out = tmp_path / "up"
    run = up(
        out,
        "--role",
        "redis",
        "--role",
        "env",
        "--set",
        "env.name=tests.envs.unservable",
        "--set",
        "env.options={}",
        "--max-restarts",
        "1",
    )
    try:
        output, _ = run.communicate(timeout=RUN_S)
    finally:
        stop_process(run)  # type: ignore[arg-type]
    assert run.returncode == 1, output
    assert re.search(r"unservable exited with code \d+: restarting it \(1 of 1\)", output), output
    assert re.search(
        r"unservable exited with code \d+, restarted once \(--max-restarts 1\); the last lines of \S+\.log:",
        output,
    )
    assert "refuses to be served" in output.split("the last lines of")[1]  # the server's own error
    assert not any(alive(p["pid"]) for p in recorded(out).values())


@outlasting(DETACH_S, START_S, STATUS_S, STOP_S)
def test_a_detached_run_shows_its_status_and_stops_on_sigterm_within_the_grace_periods(
    tmp_path: Path,
) -> None:
    out = tmp_path / "up"
    started = up(out, "--role", "redis", "--role", "env", "--detach")
    said, _ = started.communicate(timeout=DETACH_S)
    assert started.returncode == 0 and "vistarl up runs detached" in said, said
    assert wait_until(
        lambda: (
            (out / "processes.json").is_file()
            and [p["state"] for p in recorded(out).values()] == ["running", "running"]
        ),
        timeout=START_S,
    ), "the env server did not start"
    wide = {**os.environ, "COLUMNS": "200"}
    status = subprocess.run(
        vistarl_cmd("status", str(out)), capture_output=True, text=True, timeout=STATUS_S, env=wide
    )
    assert "vistarl up is running" in status.stdout and "no step finished yet" in status.stdout
    assert len(re.findall(r"│ running ", status.stdout)) == 2, status.stdout
    supervisor = int((out / "pids" / "up.pid").read_text())
    pids = [p["pid"] for p in recorded(out).values()]
    os.kill(supervisor, signal.SIGTERM)
    assert wait_until(lambda: not alive(supervisor), timeout=STOP_S), "Redis's and the env server's grace"
    log = (out / "logs" / "up.log").read_text()
    assert "SIGTERM: stopping every process" in log
    assert log.index("stopped sokoban") < log.index("stopped redis")
    assert not any(alive(pid) for pid in pids)  # type: ignore[arg-type]
    assert {p["state"] for p in recorded(out).values()} == {"stopped"}


def test_the_run_scripts_bring_the_system_up_on_a_model_path_unless_an_engine_url_is_given(
    tmp_path: Path, tiny_qwen25: Path
) -> None:
    """scripts/run_geo3k.sh with MODEL_PATH: `vistarl up`, with the GPU and worker settings; with ENGINE_URL:
    `vistarl train` alone on that engine. The interpreter the script runs is a stand-in that writes the
    command line it was given (the runs themselves are the test above and docs/benchmarks.md's)."""
    argv_file = tmp_path / "argv"
    shim = tmp_path / "python"
    shim.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > "{argv_file}"\n')
    shim.chmod(0o755)
    base = {**os.environ, "PYTHON": str(shim), "MODEL_PATH": str(tiny_qwen25)}

    def command(**settings: str) -> list[str]:
        done = subprocess.run(
            ["bash", "scripts/run_geo3k.sh", "--set", "train.steps=2"],
            cwd=ROOT,
            env={**base, **settings},
            timeout=60,
        )
        assert done.returncode == 0
        return argv_file.read_text().splitlines()

    brought_up = command(TRAINER_GPUS="0,1", ENGINE_GPUS="2", WORKERS="3", OUT="runs/up-test")
    assert brought_up[:5] == ["-m", "vistarl.cli.main", "up", "--config", "configs/geo3k.yaml"]
    for flag, value in (
        ("--out", "runs/up-test"),
        ("--trainer-gpus", "0,1"),
        ("--engine-gpus", "2"),
        ("--workers", "3"),
    ):
        assert brought_up[brought_up.index(flag) + 1] == value
    assert f"model.path={tiny_qwen25}" in brought_up and brought_up[-2:] == ["--set", "train.steps=2"]
    trained = command(ENGINE_URL="http://127.0.0.1:30000")
    assert trained[:3] == ["-m", "vistarl.cli.main", "train"]
    assert "rollout.engine=sglang:http://127.0.0.1:30000" in trained


def test_the_system_script_on_the_same_gpus_for_both_roles_brings_the_run_up_colocated(
    tmp_path: Path,
) -> None:
    """`TRAINER_GPUS=0 ENGINE_GPUS=0 scripts/run_system_gpu.sh sokoban OUT`: the `vistarl up` command it
    runs (written by a stand-in interpreter) plans no engine server and no worker process, and the trainer
    generates with the embedded engine and in-process workers."""
    argv_file, shim, models = tmp_path / "argv", tmp_path / "python", tmp_path / "models"
    shim.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > "{argv_file}"\n')
    shim.chmod(0o755)
    (models / "qwen3_vl_2b").mkdir(parents=True)
    (models / "qwen3_vl_2b" / "config.json").write_text("{}")
    settings = {"PYTHON": str(shim), "MODELS": str(models), "TRAINER_GPUS": "0", "ENGINE_GPUS": "0"}
    done = subprocess.run(
        ["bash", "scripts/run_system_gpu.sh", "sokoban", str(tmp_path / "up")],
        cwd=ROOT,
        env={**os.environ, **settings},
        timeout=60,
    )
    assert done.returncode == 0
    argv = argv_file.read_text().splitlines()
    assert argv[:3] == ["-m", "vistarl.cli.main", "up"]
    gpus = {flag: argv[argv.index(flag) + 1] for flag in ("--trainer-gpus", "--engine-gpus", "--workers")}
    assert gpus == {"--trainer-gpus": "0", "--engine-gpus": "0", "--workers": "2"}
    sets = tuple(argv[i + 1] for i, arg in enumerate(argv) if arg == "--set")
    require(shutil.which("redis-server") is not None, "vistarl up starts redis-server: install it")
    options = UpOptions(
        config=ROOT / argv[argv.index("--config") + 1],
        out=tmp_path / "up",
        overrides=sets,
        workers=2,
        trainer_gpus=(0,),
        engine_gpus=(0,),
    )
    plan = plan_processes(options)
    assert [spec.name for spec in plan.processes] == ["redis", "sokoban", "trainer"]
    assert "--set=rollout.engine=hf" in plan.processes[-1].argv
