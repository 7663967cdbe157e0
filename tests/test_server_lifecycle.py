"""The environment server's bounds over its lifetime: capacity, idle expiry, auth, CLI settings, shutdown."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.envs.serving import COUNTER_ENV, counter_process, counter_server
from tests.servers import wait_until
from vistarl.clients.protocol import ErrorResponse
from vistarl.devtools.servers import vistarl_cmd

TIMEOUT = 30.0
TTL = 1.5


def error_code(response: httpx.Response) -> str:
    return ErrorResponse.model_validate(response.json()).error.code


@dataclass
class Server:
    """A client of one server, remembering the sessions it opened so they can be closed afterwards."""

    client: httpx.Client
    opened: list[str] = field(default_factory=list)

    def open(self, **options: object) -> str:
        response = self.client.post("/reset", json={"options": options})
        assert response.status_code == 200, response.text
        session: str = response.json()["session_id"]
        self.opened.append(session)
        return session

    def close_opened(self) -> None:
        for session in self.opened:
            self.client.delete(f"/sessions/{session}")


@contextlib.contextmanager
def server(url: str) -> Iterator[Server]:
    """A `Server` client of `url` that closes the sessions it opened on the way out."""
    with httpx.Client(base_url=url, timeout=TIMEOUT) as client:
        srv = Server(client)
        yield srv
        srv.close_opened()


@pytest.fixture(scope="module", params=["0", "1"], ids=["threads", "1-env-worker"])
def small_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """Two sessions at most, a 3 s Retry-After and a 1 s bound on env calls (from env vars), envs in
    threads or in a worker process."""
    env = {
        "VISTARL_MAX_SESSIONS": "2",
        "VISTARL_RETRY_AFTER_S": "3",
        "VISTARL_ENV_TIMEOUT_S": "1",
        "VISTARL_ENV_WORKERS": request.param,
    }
    with counter_server(env=env) as url:
        yield url


@pytest.fixture
def small(small_url: str) -> Iterator[Server]:
    with server(small_url) as srv:
        yield srv


@pytest.fixture
def short_ttl() -> Iterator[Server]:
    """A short idle TTL and a fast reaper (from flags)."""
    with counter_server("--session-ttl", str(TTL), "--reaper-interval", "0.1") as url, server(url) as srv:
        yield srv


def test_capacity_is_503_with_retry_after(small: Server) -> None:
    assert small.client.get("/info").json()["limits"]["max_sessions"] == 2
    first = small.open()
    small.open()
    full = small.client.post("/reset", json={})
    assert full.status_code == 503
    assert full.headers["retry-after"] == "3"
    assert error_code(full) == "at_capacity"
    not_ready = small.client.get("/ready")
    assert not_ready.status_code == 503
    assert not_ready.headers["retry-after"] == "3"
    assert not_ready.json() == {"ready": False, "active_sessions": 2, "max_sessions": 2, "draining": False}
    assert small.client.get("/health").status_code == 200
    assert small.client.delete(f"/sessions/{first}").status_code == 204
    assert small.client.get("/ready").status_code == 200
    small.open()


def test_an_env_call_past_the_timeout_is_500_and_closes_the_session(small: Server) -> None:
    session = small.open(step_delay_s=3.0)
    late = small.client.post("/step", json={"session_id": session, "action": "inc"})
    assert late.status_code == 500
    assert error_code(late) == "internal_error"
    assert "exceeded" in late.json()["error"]["message"]
    assert error_code(small.client.post("/step", json={"session_id": session, "action": "inc"})) == (
        "session_not_found"
    )
    assert small.client.get("/ready").json()["active_sessions"] == 0


def test_idle_sessions_expire_but_active_ones_live(short_ttl: Server) -> None:
    http = short_ttl.client
    assert http.get("/info").json()["limits"]["session_ttl_s"] == TTL
    idle, active = short_ttl.open(), short_ttl.open()
    deadline = time.monotonic() + 3 * TTL
    while time.monotonic() < deadline:  # keep one session busy well past the TTL
        assert http.post("/step", json={"session_id": active, "action": "noop"}).status_code == 200
        time.sleep(TTL / 8)
    gone = http.post("/step", json={"session_id": idle, "action": "inc"})
    assert gone.status_code == 404
    assert error_code(gone) == "session_not_found"
    assert http.get("/ready").json()["active_sessions"] == 1
    assert "vistarl_env_expired_sessions_total 1.0" in http.get("/metrics").text
    assert wait_until(lambda: http.get("/ready").json()["active_sessions"] == 0, timeout=10 * TTL)
    assert http.post("/step", json={"session_id": active, "action": "inc"}).status_code == 404


def test_bearer_token_guards_the_env_endpoints_and_leaves_probes_and_metrics_open() -> None:
    token = "s3cret-token"
    with counter_server(env={"VISTARL_API_TOKEN": token}) as url, httpx.Client(base_url=url) as client:
        for method, path in [("GET", "/info"), ("POST", "/reset"), ("POST", "/step"), ("POST", "/format")]:
            for headers in [{}, {"Authorization": "Bearer wrong"}, {"Authorization": token}]:
                refused = client.request(method, path, headers=headers, json={})
                assert refused.status_code == 401, (method, path, headers)
                assert error_code(refused) == "unauthorized"
                assert refused.headers["www-authenticate"] == "Bearer"
        assert client.delete("/sessions/any").status_code == 401
        assert client.get("/health").status_code == 200
        assert client.get("/ready").json()["active_sessions"] == 0
        auth = {"Authorization": f"Bearer {token}"}
        assert client.get("/info", headers=auth).status_code == 200
        assert client.post("/reset", json={}, headers=auth).status_code == 200
        assert client.get("/ready").json()["active_sessions"] == 1
        scraped = client.get("/metrics")
        assert scraped.status_code == 200
        assert 'vistarl_env_errors_total{code="unauthorized"} 13.0' in scraped.text
        assert "vistarl_env_resets_total 1.0" in scraped.text


def test_bad_settings_are_refused_by_the_cli() -> None:
    args = vistarl_cmd("serve", COUNTER_ENV, "--max-sessions", "0")
    done = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert "max_sessions" in done.stderr
    not_redis = vistarl_cmd("serve", COUNTER_ENV, "--session-store", "http://redis:6379")
    done = subprocess.run(not_redis, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert "session_store: expected a Redis URL" in done.stderr
    unknown = subprocess.run(vistarl_cmd("serve", "no_such_env"), capture_output=True, text=True, timeout=60)
    assert unknown.returncode == 2
    assert "unknown environment" in unknown.stderr


@pytest.mark.parametrize("workers", ["0", "2"])
def test_sigterm_finishes_the_step_in_flight_closes_envs_and_exits_0(tmp_path: Path, workers: str) -> None:
    closed, stepping_now = tmp_path / "closed", tmp_path / "stepping"
    options = {"step_delay_s": 1.0, "close_marker": str(closed), "step_marker": str(stepping_now)}
    server = counter_process("--env-workers", workers)
    with server as (url, proc), httpx.Client(base_url=url, timeout=TIMEOUT) as client:
        session = client.post("/reset", json={"options": options}).json()["session_id"]
        answers: list[httpx.Response] = []
        stepping = threading.Thread(
            target=lambda: answers.append(client.post("/step", json={"session_id": session, "action": "inc"}))
        )
        stepping.start()
        assert wait_until(stepping_now.exists)  # the step is now sleeping inside the env
        proc.send_signal(signal.SIGTERM)
        stepping.join(timeout=TIMEOUT)
        assert proc.wait(timeout=15) == 0
    assert [a.status_code for a in answers] == [200]
    assert answers[0].json()["observation"]["text"].startswith("count=1")
    assert closed.exists()
