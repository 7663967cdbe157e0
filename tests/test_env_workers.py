"""Env worker processes: session affinity, a worker's death and replacement, and the frame protocol."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import msgpack
import pytest
from fastapi.testclient import TestClient

from tests.envs.counter import ENV_FACTORY
from tests.envs.serving import COUNTER_ENV, counter_process, served_process
from tests.servers import children, metric, wait_until
from vistarl.services.env_api import load_env_factory
from vistarl.services.server import settings as server_settings
from vistarl.services.server.app import create_app
from vistarl.services.server.env_calls import EnvHost
from vistarl.services.server.env_pool import create_pool
from vistarl.services.server.metrics import ServerMetrics
from vistarl.services.server.process_pool import ProcessEnvPool
from vistarl.services.server.settings import ServerSettings, usable_cores
from vistarl.services.server.thread_pool import ThreadEnvPool
from vistarl.services.server.worker_process import serve

TIMEOUT = 30.0


def test_a_dead_worker_loses_only_its_sessions_and_is_replaced() -> None:
    with (
        counter_process("--env-workers", "2") as (url, proc),
        httpx.Client(base_url=url, timeout=TIMEOUT) as http,
    ):
        assert http.get("/ready").json()["ready"] is True  # once the workers have started
        assert metric(url, "vistarl_env_workers") == 2
        sessions = [
            http.post("/reset", json={"options": {"target": 50}}).json()["session_id"] for _ in range(2)
        ]
        workers = children(proc.pid)
        assert len(workers) == 2
        os.kill(workers[0], signal.SIGKILL)
        answers = [http.post("/step", json={"session_id": s, "action": "inc"}) for s in sessions]
        assert sorted(a.status_code for a in answers) == [200, 500]  # one session per worker
        lost_answer = next(a for a in answers if a.status_code == 500)
        lost = sessions[answers.index(lost_answer)]
        message = lost_answer.json()["error"]["message"]  # it died during the call, or before it
        assert "exited" in message or "is not running" in message
        assert http.post("/step", json={"session_id": lost, "action": "inc"}).status_code == 404
        kept = sessions[1 - answers.index(lost_answer)]
        assert (
            http.post("/step", json={"session_id": kept, "action": "inc"})
            .json()["observation"]["text"]
            .startswith("count=2")
        )
        assert wait_until(lambda: metric(url, "vistarl_env_worker_restarts_total") == 1)
        assert metric(url, "vistarl_env_workers") == 2
        assert len(children(proc.pid)) == 2
        fresh = [http.post("/reset", json={}).json()["session_id"] for _ in range(2)]
        assert all(
            http.post("/step", json={"session_id": s, "action": "inc"}).status_code == 200 for s in fresh
        )


def gated_process(gate: Path) -> contextlib.AbstractContextManager[tuple[str, subprocess.Popen[bytes]]]:
    """A server of `tests.envs.gated` with two env workers, which load the env only once `gate` exists."""
    return served_process("tests.envs.gated", "--env-workers", "2", env={"VISTARL_TEST_GATE": str(gate)})


def test_the_server_answers_while_its_workers_start_and_is_ready_once_they_have(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    with (
        gated_process(gate) as (url, _),
        httpx.Client(base_url=url, timeout=TIMEOUT) as http,
        ThreadPoolExecutor(2) as calls,
    ):
        assert http.get("/health").status_code == 200  # the workers wait at the gate meanwhile
        assert metric(url, "vistarl_env_workers") == 0
        ready = calls.submit(http.get, "/ready")
        reset = calls.submit(http.post, "/reset", json={"options": {"target": 2}})
        time.sleep(0.5)
        assert not ready.done() and not reset.done(), "both wait for the workers"
        gate.write_text("open")
        assert ready.result(timeout=TIMEOUT).json()["ready"] is True
        session = reset.result(timeout=TIMEOUT).json()["session_id"]
        assert http.post("/step", json={"session_id": session, "action": "inc"}).status_code == 200
        assert metric(url, "vistarl_env_workers") == 2


def test_workers_that_cannot_start_leave_the_server_unready_and_say_why(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    gate.write_text("fail")
    with gated_process(gate) as (url, proc), httpx.Client(base_url=url, timeout=TIMEOUT) as http:
        ready = http.get("/ready")
        assert ready.status_code == 503 and ready.json()["ready"] is False
        for answer in (http.post("/reset", json={}), http.post("/format", json={"observation": {}})):
            assert answer.status_code == 500
            message = answer.json()["error"]["message"]
            assert "the env workers did not start: env worker" in message and "exited with code 1" in message
        assert http.get("/health").status_code == 200
        assert wait_until(lambda: children(proc.pid) == [])


def test_what_an_env_prints_stays_off_the_frames() -> None:
    with (
        counter_process("--env-workers", "1") as (url, _),
        httpx.Client(base_url=url, timeout=TIMEOUT) as http,
    ):
        session = http.post("/reset", json={"options": {"chatty": True, "target": 3}}).json()["session_id"]
        answers = [http.post("/step", json={"session_id": session, "action": "inc"}).json() for _ in range(3)]
        assert [a["done"] for a in answers] == [False, False, True]
        assert answers[-1]["info"]["episode_reward"] == 3.0


def served(calls: list[list[object]]) -> tuple[list[list[object]], EnvHost]:
    """Every answer a worker's `serve` writes for `calls` sent at once (then the end of its input), in the
    order written, and the host it served them from."""
    calls_r, calls_w = os.pipe()
    answers_r, answers_w = os.pipe()
    os.write(calls_w, b"".join(msgpack.packb(call) for call in calls))
    os.close(calls_w)
    host = EnvHost(ENV_FACTORY, max_image_bytes=1 << 20, max_image_pixels=1 << 16)
    with os.fdopen(answers_w, "wb") as sink:
        worker = threading.Thread(target=serve, args=(host, calls_r, sink))
        worker.start()
        worker.join(timeout=TIMEOUT)
    unpacker = msgpack.Unpacker()
    with os.fdopen(answers_r, "rb") as source:
        unpacker.feed(source.read())
    return list(unpacker), host


def test_the_worker_answers_every_call_and_survives_bad_ones() -> None:
    answers, host = served(
        [
            [1, "bogus", []],
            [2, "reset", ["s1", {"target": 10}, 5, None, False]],
            [3, "step", ["s1", "inc", True]],
            [4, "step", ["nope", "inc", False]],
            [5, "reset", ["s2", {"refuse": "no thanks"}, None, None, False]],
            [6, "close", ["s1"]],
        ]
    )
    by_id = {answer[0]: answer for answer in answers}
    assert len(answers) == len(by_id) == 6
    assert by_id[1][1] is False and by_id[1][2][0] == "internal_error" and "bogus" in by_id[1][2][1]
    body, state = by_id[2][2]
    assert json.loads(body)["observation"]["text"].startswith("count=5") and state is None
    done, body, state = by_id[3][2]
    assert done is False and json.loads(body)["message"]["role"] == "user" and state is None
    assert by_id[4][1] is False and by_id[4][2][0] == "internal_error"
    assert by_id[5][1] is False and by_id[5][2] == [
        "invalid_options",
        "options rejected by counter: no thanks",
    ]
    assert by_id[6] == [6, True, None] and host.envs == {}


def test_a_step_passes_the_resets_of_other_sessions_but_not_its_own() -> None:
    answers, _ = served(
        [
            [1, "reset", ["a", {"target": 10}, None, None, False]],
            [2, "reset", ["b", {"target": 10}, None, None, False]],
            [3, "reset", ["c", {"target": 10}, None, None, False]],
            [4, "step", ["a", "inc", False]],
            [5, "step", ["b", "inc", False]],
        ]
    )
    assert [answer[0] for answer in answers] == [1, 4, 2, 5, 3]  # resets take turns with waiting steps
    assert all(ok for _, ok, _ in answers)
    for _, _, (done, body, _) in (answer for answer in answers if answer[0] in (4, 5)):
        assert done is False and json.loads(body)["observation"]["text"].startswith("count=1")


@pytest.mark.parametrize(("cores", "workers"), [(1, 0), (2, 2), (6, 6)])
def test_the_default_is_an_env_worker_per_usable_core_and_threads_on_one(
    monkeypatch: pytest.MonkeyPatch, cores: int, workers: int
) -> None:
    monkeypatch.setattr(server_settings, "usable_cores", lambda: cores)
    settings = ServerSettings(api_token=None)
    assert settings.env_workers == workers
    pool = create_pool(load_env_factory(COUNTER_ENV), settings, ServerMetrics())
    if workers:
        assert isinstance(pool, ProcessEnvPool) and len(pool.workers) == workers
    else:
        assert isinstance(pool, ThreadEnvPool)
    assert ServerSettings(env_workers=0).env_workers == 0  # still there to ask for, e.g. to debug


def test_usable_cores_are_the_affinity_narrowed_by_a_cgroup_cpu_quota(tmp_path: Path) -> None:
    affinity = len(os.sched_getaffinity(0))
    cpu_max = tmp_path / "cpu.max"
    assert usable_cores(cpu_max) == affinity  # no cgroup v2 file
    cpu_max.write_text("max 100000\n")
    assert usable_cores(cpu_max) == affinity  # no quota
    cpu_max.write_text("50000 100000\n")
    assert usable_cores(cpu_max) == 1  # half a core is still one
    cpu_max.write_text(f"{100000 * affinity + 1} 100000\n")
    assert usable_cores(cpu_max) == affinity  # a quota above the affinity does not add cores


def test_a_factory_without_an_import_path_runs_in_threads_unless_workers_are_asked_for() -> None:
    pool = create_pool(ENV_FACTORY, ServerSettings(api_token=None), ServerMetrics())
    assert isinstance(pool, ThreadEnvPool)


def test_a_factory_without_an_import_path_cannot_run_in_workers() -> None:
    assert ENV_FACTORY.import_path is None  # the counter env leaves it to load_env_factory
    with pytest.raises(ValueError, match="load_env_factory"):
        create_app(ENV_FACTORY, ServerSettings(env_workers=1, api_token=None))


def test_an_app_in_process_starts_and_stops_its_workers() -> None:
    factory = load_env_factory(COUNTER_ENV)
    assert factory.import_path == COUNTER_ENV
    with TestClient(create_app(factory, ServerSettings(env_workers=1, api_token=None))) as client:
        session = client.post("/reset", json={"seed": 40}).json()["session_id"]
        answer = client.post("/step", json={"session_id": session, "action": "inc"}).json()
        assert answer["observation"]["text"].startswith("count=41")
        formatted = client.post("/format", json={"observation": answer["observation"]}).json()
        assert formatted["message"]["content"][-1]["text"] == answer["observation"]["text"]
