"""Clients given several replicas: a dead or full replica passes the call on, within the same deadline.

The failover test starts two real `vistarl serve tests.envs.counter` processes, of which `a` holds one
session at most. Both clients run each test: `EnvClient` and `AsyncEnvClient` (`tests.client_kinds`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.client_kinds import Client
from tests.envs.serving import counter_process, counter_server
from tests.retries import retry_waits
from vistarl.clients import EnvConnectionError, RetryPolicy, SessionNotFoundError
from vistarl.httpserver.launch import free_port, stop_process

# A backoff far longer than the test: a retry on another replica must not wait for it.
SLOW_BACKOFF = RetryPolicy(max_attempts=4, base_delay=20.0, max_delay=20.0, deadline_s=30.0)


def sessions_on(url: str) -> int:
    """Live sessions of one replica, from its `/metrics`."""
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=10).text):
        if family.name == "vistarl_env_active_sessions":
            return int(family.samples[0].value)
    raise AssertionError(f"{url}/metrics has no vistarl_env_active_sessions")


@pytest.fixture
def caplog_retries(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    caplog.set_level(logging.INFO, logger="vistarl.clients.http")
    yield caplog


def retries(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if "retry" in record.getMessage()]


def test_reset_and_info_fail_over_from_a_full_then_a_dead_replica(
    client_type: type[Client], caplog_retries: pytest.LogCaptureFixture
) -> None:
    with counter_process("--max-sessions", "1") as (a, a_proc), counter_server() as b:
        with client_type([a, b], token="", retry=SLOW_BACKOFF) as client:
            on_a = client.reset()
            assert (sessions_on(a), sessions_on(b)) == (1, 0)
            on_b = client.reset()  # a answers 503 at_capacity: b takes it at once
            assert retry_waits(caplog_retries.records) == [0.0]
            assert (sessions_on(a), sessions_on(b)) == (1, 1)
            assert any("503" in line and b in line for line in retries(caplog_retries))

            assert client.step(on_a.session_id, "inc").observation.text.startswith("count=1")  # its replica
            assert client.step(on_b.session_id, "inc").observation.text.startswith("count=1")

            stop_process(a_proc)
            caplog_retries.clear()
            assert client.info().name == "counter"
            assert client.reset().session_id
            assert not any(retry_waits(caplog_retries.records))  # b at once, never after the backoff
            assert sessions_on(b) == 2
            with pytest.raises(SessionNotFoundError):  # a's session died with a: no shared session store
                client.step(on_a.session_id, "inc")

        with client_type([a, b], token="", retry=SLOW_BACKOFF) as fresh:  # starts at dead a
            caplog_retries.clear()
            assert fresh.reset().session_id
            assert fresh.info().name == "counter"
            moved = retries(caplog_retries)
            assert len(moved) == 1 and "ClientConnectorError" in moved[0] and b in moved[0]
            assert sessions_on(b) == 3


def test_with_no_replica_reachable_the_call_fails_within_its_bounds(client_type: type[Client]) -> None:
    dead = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]
    policy = RetryPolicy(max_attempts=6, base_delay=0.05, max_delay=0.1, deadline_s=5.0)
    with (
        client_type(dead, token="", retry=policy) as client,
        pytest.raises(EnvConnectionError, match="6 att"),
    ):
        client.reset()
