"""`EnvClient` / `AsyncEnvClient` against a real HTTP server that misbehaves on cue.

`ScriptedEnvServer` is a stdlib HTTP server on a loopback port that speaks the env protocol for a
counter (each applied step adds one) and first plays a script of canned answers: busy replies with
Retry-After, connections dropped after the request was applied, stalls, and error bodies.

The retry and error tests run on both clients (`tests.client_kinds`): `EnvClient`, which drives an
`AsyncEnvClient` on an event-loop thread of its own, and the `AsyncEnvClient` itself.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import aiohttp
import httpx
import pytest

from tests.client_kinds import Client
from tests.retries import retry_waits
from vistarl.clients import (
    AsyncEnvClient,
    AuthError,
    BadRequestError,
    EnvClient,
    EnvConnectionError,
    EnvServerError,
    EpisodeDoneError,
    PayloadTooLargeError,
    ProtocolError,
    RequestIdReusedError,
    RetryPolicy,
    ServerBusyError,
    ServerError,
    SessionExistsError,
    SessionNotFoundError,
    TaskNotFoundError,
)
from vistarl.clients.calls import Reply
from vistarl.clients.http import env_proxy
from vistarl.clients.protocol import (
    ErrorResponse,
    InfoResponse,
    Limits,
    Observation,
    ReadyResponse,
    ResetResponse,
    StepRequest,
    StepResponse,
)
from vistarl.clients.retry import Delivery, attempt_until_final, delivery, retry_after_seconds, retry_delay
from vistarl.httpserver.launch import free_port

FAST = RetryPolicy(max_attempts=5, base_delay=0.05, max_delay=0.2, deadline_s=10.0)


@dataclass
class Canned:
    """One scripted answer: a fixed response, or a stall / dropped connection around the normal answer."""

    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    drop_after_apply: bool = False
    stall_s: float = 0.0


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


def error_body(code: str, message: str) -> bytes:
    return (
        ErrorResponse.model_validate({"error": {"code": code, "message": message}}).model_dump_json().encode()
    )


class ScriptedEnvServer:
    """A counter env server (real HTTP, own thread) that plays `script` before answering normally."""

    def __init__(self) -> None:
        self.script: deque[Canned] = deque()
        self.seen: list[Seen] = []
        self.results: dict[str, StepResponse] = {}
        self.applied = 0
        self.lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", free_port()), self._handler_class())
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def requests_to(self, path: str) -> list[Seen]:
        return [s for s in self.seen if s.path == path]

    def answer(self, method: str, path: str, body: bytes) -> tuple[int, bytes]:
        """The normal behaviour: one session whose steps count up; a step's request_id is applied once."""
        if method == "POST" and path == "/reset":
            first = ResetResponse(session_id="s-1", observation=Observation(text="count=0"))
            return 200, first.model_dump_json().encode()
        if method == "POST" and path == "/step":
            req = StepRequest.model_validate_json(body)
            key = req.request_id or ""
            with self.lock:
                if key not in self.results:
                    self.applied += 1
                    obs = Observation(text=f"count={self.applied}")
                    self.results[key] = StepResponse(observation=obs, reward=1.0, done=self.applied >= 3)
                return 200, self.results[key].model_dump_json().encode()
        if method == "DELETE" and path.startswith("/sessions/"):
            return 204, b""
        if method == "GET" and path == "/info":
            return 200, _INFO.model_dump_json().encode()
        if method == "GET" and path == "/health":
            return 200, b'{"status": "healthy"}'
        return 404, error_body("not_found", f"no route {method} {path}")

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _serve(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                with server.lock:
                    headers = {k.lower(): v for k, v in self.headers.items()}
                    server.seen.append(Seen(self.command, self.path, headers, body))
                    canned = server.script.popleft() if server.script else None
                if canned is not None and (canned.drop_after_apply or canned.stall_s):
                    time.sleep(canned.stall_s)
                    status, payload, headers = *server.answer(self.command, self.path, body), {}
                    if canned.drop_after_apply:
                        self.close_connection = True
                        return
                elif canned is not None:
                    status, payload, headers = canned.status, canned.body, canned.headers
                else:
                    status, payload, headers = *server.answer(self.command, self.path, body), {}
                with contextlib.suppress(OSError):
                    self.send_response(status)
                    for name, value in headers.items():
                        self.send_header(name, value)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)

            do_GET = do_POST = do_DELETE = _serve

            def log_message(self, format: str, *args: object) -> None:
                """Quiet: the test asserts on `server.seen` instead."""

        return Handler


_INFO = InfoResponse(
    name="scripted",
    version="0",
    description="scripted counter",
    system_prompt="count",
    action_format="anything",
    config_schema={},
    limits=Limits(
        max_sessions=1,
        session_ttl_s=60,
        max_body_bytes=1 << 20,
        max_image_bytes=1 << 20,
        max_image_pixels=1 << 20,
        max_action_chars=100,
        idempotency_cache_size=8,
        env_timeout_s=60,
        retry_after_s=1,
    ),
)

BUSY = Canned(503, error_body("at_capacity", "full"), {"retry-after": "1"})


@pytest.fixture
def server() -> Iterator[ScriptedEnvServer]:
    srv = ScriptedEnvServer()
    thread = threading.Thread(target=srv.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.httpd.shutdown()
        srv.httpd.server_close()
        thread.join(timeout=5)


@pytest.fixture
def client(server: ScriptedEnvServer, client_type: type[Client]) -> Iterator[Client]:
    with client_type(server.url, token="", retry=FAST, timeout=5.0) as c:
        yield c


@pytest.fixture
def sync_client(server: ScriptedEnvServer) -> Iterator[EnvClient]:
    with EnvClient(server.url, token="", retry=FAST, timeout=5.0) as c:
        yield c


# --- the pure retry decisions ---------------------------------------------------------------------


def test_retry_after_accepts_seconds_and_http_dates() -> None:
    assert retry_after_seconds("3") == 3.0
    assert retry_after_seconds(None) is None
    assert retry_after_seconds("soon") is None
    in_ten = format_datetime(datetime.now(timezone.utc) + timedelta(seconds=10), usegmt=True)
    assert 8.0 < (retry_after_seconds(in_ten) or 0) <= 10.0
    past = format_datetime(datetime.now(timezone.utc) - timedelta(seconds=10), usegmt=True)
    assert retry_after_seconds(past) == 0.0


def test_retry_delay_decisions() -> None:
    policy = RetryPolicy(max_attempts=3, base_delay=0.1, max_delay=1.0, deadline_s=30)
    busy = Reply(503, b"", "http://env/info", retry_after="2")
    for lost in (aiohttp.SocketTimeoutError("lost"), aiohttp.ServerDisconnectedError()):
        assert retry_delay(policy, lost, attempt=1, idempotent=True, remaining=30) is not None
        assert retry_delay(policy, lost, attempt=1, idempotent=False, remaining=30) is None
    unsent = aiohttp.ConnectionTimeoutError()
    assert retry_delay(policy, unsent, attempt=2, idempotent=False, remaining=30) is not None
    assert 2.0 <= (retry_delay(policy, busy, attempt=1, idempotent=False, remaining=30) or 0) <= 2.1
    assert retry_delay(policy, busy, attempt=3, idempotent=True, remaining=30) is None
    assert retry_delay(policy, busy, attempt=1, idempotent=True, remaining=1.5) is None
    assert retry_delay(policy, Reply(500, b"", "u"), attempt=1, idempotent=True, remaining=30) is None
    assert retry_delay(policy, aiohttp.InvalidURL("ftp"), attempt=1, idempotent=True, remaining=30) is None


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (aiohttp.ConnectionTimeoutError("connect or pool wait"), Delivery.NOT_SENT),
        (aiohttp.SocketTimeoutError("slow answer"), Delivery.MAYBE_APPLIED),
        (asyncio.TimeoutError(), Delivery.MAYBE_APPLIED),
        (aiohttp.ServerDisconnectedError(), Delivery.MAYBE_APPLIED),
        (aiohttp.ClientOSError(104, "connection reset"), Delivery.MAYBE_APPLIED),
        (aiohttp.ClientPayloadError("cut short"), Delivery.MAYBE_APPLIED),
        (aiohttp.InvalidURL("no host"), Delivery.FATAL),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, Exception) else value.name,
)
def test_transport_failures_are_classified_by_how_far_the_request_went(
    error: Exception, expected: Delivery
) -> None:
    assert delivery(error) is expected


def test_backoff_stops_at_the_attempt_bound_and_never_sleeps_past_the_deadline() -> None:
    policy = RetryPolicy(max_attempts=3, base_delay=0.5, max_delay=0.5, deadline_s=30)
    assert all(0 <= (policy.backoff(1, remaining=30) or -1) <= 0.5 for _ in range(50))
    assert policy.backoff(3, remaining=30) is None
    assert policy.backoff(1, remaining=0.0) is None
    near_deadline = [policy.backoff(1, remaining=0.05) for _ in range(200)]
    assert None in near_deadline and all(delay is None or delay < 0.05 for delay in near_deadline)
    outage = RetryPolicy.outage(5.0)
    assert outage.backoff(10_000, remaining=5.0) is not None and outage.backoff(10_000, remaining=-1) is None


async def test_the_retry_loop_runs_attempts_until_the_policy_says_final() -> None:
    answers = iter([ConnectionError("down"), ConnectionError("down"), "up", "never asked"])
    seen: list[tuple[object, int]] = []

    async def attempt() -> object:
        return next(answers)

    def next_delay(outcome: object, attempts: int) -> float | None:
        seen.append((outcome if isinstance(outcome, str) else type(outcome).__name__, attempts))
        return 0.01 if isinstance(outcome, Exception) else None

    assert await attempt_until_final(attempt, next_delay) == ("up", 3)
    assert seen == [("ConnectionError", 1), ("ConnectionError", 2), ("up", 3)]


def test_retry_policy_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="max_attempts"):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ValueError, match="deadline_s"):
        RetryPolicy(deadline_s=0)


# --- retries against a real server ----------------------------------------------------------------


def test_busy_server_is_retried_honouring_retry_after(
    server: ScriptedEnvServer, client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="vistarl.clients.http")
    server.script.extend([BUSY, BUSY])
    assert client.info().name == "scripted"
    assert len(server.requests_to("/info")) == 3
    waits = retry_waits(caplog.records)
    assert len(waits) == 2 and all(1.0 <= wait <= 1.0 + FAST.base_delay for wait in waits)  # Retry-After: 1


def test_deadline_bounds_total_time_and_then_raises_busy(
    server: ScriptedEnvServer, client_type: type[Client], caplog: pytest.LogCaptureFixture
) -> None:
    """Retry-After 1 s against a 2.5 s deadline: the client stops at the retry that would start past it,
    though 100 attempts are allowed."""
    caplog.set_level(logging.INFO, logger="vistarl.clients.http")
    server.script.extend([BUSY] * 20)
    policy = RetryPolicy(max_attempts=100, base_delay=0.05, max_delay=0.2, deadline_s=2.5)
    with client_type(server.url, token="", retry=policy) as c, pytest.raises(ServerBusyError) as err:
        c.info()
    assert err.value.status == 503 and err.value.code == "at_capacity"
    waits = retry_waits(caplog.records)
    assert 1 <= len(waits) <= 2 and sum(waits) < policy.deadline_s
    assert len(server.requests_to("/info")) == len(waits) + 1


def test_step_resent_after_a_lost_response_is_applied_once(server: ScriptedEnvServer, client: Client) -> None:
    server.script.append(Canned(drop_after_apply=True))
    result = client.step("s-1", "up")
    assert result.observation.text == "count=1"
    steps = server.requests_to("/step")
    assert len(steps) == 2
    ids = {json.loads(s.body)["request_id"] for s in steps}
    assert len(ids) == 1
    assert server.applied == 1


def test_steps_get_fresh_request_ids_unless_given(server: ScriptedEnvServer, client: Client) -> None:
    client.step("s-1", "a")
    client.step("s-1", "b")
    client.step("s-1", "c", request_id="mine")
    ids = [json.loads(s.body)["request_id"] for s in server.requests_to("/step")]
    assert len(set(ids[:2])) == 2 and ids[2] == "mine"
    assert server.applied == 3


def test_reset_is_not_resent_after_a_lost_response(server: ScriptedEnvServer, client: Client) -> None:
    """The server read the reset and dropped the connection: "disconnected" is not "never connected"."""
    server.script.append(Canned(drop_after_apply=True))
    with pytest.raises(EnvConnectionError, match="1 attempt"):
        client.reset(seed=1)
    assert len(server.requests_to("/reset")) == 1


def test_reset_is_not_resent_after_a_read_timeout(server: ScriptedEnvServer, client: Client) -> None:
    server.script.append(Canned(stall_s=1.5))
    with pytest.raises(EnvConnectionError, match="1 attempt"):
        client.reset(seed=1, timeout=0.3)
    assert len(server.requests_to("/reset")) == 1


def test_read_timeout_on_an_idempotent_call_is_retried(server: ScriptedEnvServer, client: Client) -> None:
    server.script.append(Canned(stall_s=2.0))
    assert client.info(timeout=0.5).name == "scripted"
    assert len(server.requests_to("/info")) == 2


def test_unreachable_server_raises_connection_error_after_bounded_attempts(client_type: type[Client]) -> None:
    """A refused connection never reached the server, so even a reset is resent, within the bound."""
    policy = RetryPolicy(max_attempts=3, base_delay=0.01, max_delay=0.05, deadline_s=10)
    with client_type(f"http://127.0.0.1:{free_port()}", token="", retry=policy) as c:
        with pytest.raises(EnvConnectionError, match="3 attempt"):
            c.reset()
        with pytest.raises(EnvConnectionError, match="3 attempt"):
            c.info()
        with pytest.raises(EnvConnectionError, match="1 attempt"):
            c.health()


async def test_a_reset_that_timed_out_waiting_for_a_free_connection_is_resent(
    server: ScriptedEnvServer, caplog: pytest.LogCaptureFixture
) -> None:
    """With the only connection busy, a reset's wait for it times out before anything is sent."""
    server.script.append(Canned(stall_s=1.5))
    patient = RetryPolicy(max_attempts=50, base_delay=0.01, max_delay=0.05, deadline_s=30)
    one_connection = httpx.Limits(max_connections=1)
    caplog.set_level(logging.INFO, logger="vistarl.clients.http")
    async with AsyncEnvClient(server.url, token="", retry=patient, limits=one_connection) as c:
        slow = asyncio.create_task(c.info(timeout=10))
        for _ in range(500):
            if server.requests_to("/info"):
                break
            await asyncio.sleep(0.01)
        first = await c.reset(timeout=0.2)
        assert (await slow).name == "scripted"
    assert first.session_id == "s-1"
    assert len(server.requests_to("/reset")) == 1
    assert any("POST /reset: ConnectionTimeoutError" in r.getMessage() for r in caplog.records)


async def test_async_client_refuses_a_second_event_loop_and_use_after_shutdown(
    server: ScriptedEnvServer,
) -> None:
    c = AsyncEnvClient(server.url, token="")
    assert (await c.health()).status == "healthy"
    with concurrent.futures.ThreadPoolExecutor(1) as other_thread:
        on_another_loop = other_thread.submit(asyncio.run, c.health())
        with pytest.raises(RuntimeError, match="event loop of its first call"):
            on_another_loop.result(timeout=10)
    await c.shutdown()
    with pytest.raises(RuntimeError, match="is closed"):
        await c.health()


def test_proxy_settings_of_the_environment_are_honoured(
    server: ScriptedEnvServer, client_type: type[Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both clients send through $HTTP_PROXY, as httpx does, unless $NO_PROXY exempts the host."""
    monkeypatch.setenv("HTTP_PROXY", server.url)
    monkeypatch.setenv("NO_PROXY", "exempt.invalid")
    assert env_proxy("http://exempt.invalid:1") is None
    with client_type("http://env.invalid:9", token="", retry=FAST) as c, pytest.raises(EnvServerError):
        c.info()
    assert [s.path for s in server.seen] == ["http://env.invalid:9/info"]


# --- typed errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "code", "exc_type"),
    [
        (400, "bad_request", BadRequestError),
        (401, "unauthorized", AuthError),
        (404, "session_not_found", SessionNotFoundError),
        (409, "episode_done", EpisodeDoneError),
        (409, "session_exists", SessionExistsError),
        (409, "request_id_reused", RequestIdReusedError),
        (404, "task_not_found", TaskNotFoundError),
        (413, "payload_too_large", PayloadTooLargeError),
        (422, "validation_error", BadRequestError),
        (500, "internal_error", ServerError),
        (418, "teapot", EnvServerError),
    ],
)
def test_error_answers_become_typed_exceptions(
    server: ScriptedEnvServer, client: Client, status: int, code: str, exc_type: type[EnvServerError]
) -> None:
    server.script.append(Canned(status, error_body(code, "told you so")))
    with pytest.raises(exc_type) as err:
        client.step("s-1", "x")
    assert type(err.value) is exc_type
    assert (err.value.status, err.value.code, err.value.message) == (status, code, "told you so")
    assert len(server.requests_to("/step")) == 1


def test_non_json_error_body_still_gives_a_typed_exception(server: ScriptedEnvServer, client: Client) -> None:
    server.script.append(Canned(502, b"<html>Bad Gateway</html>"))
    with pytest.raises(ServerError) as err:
        client.info()
    assert err.value.code == "http_502"
    assert "Bad Gateway" in err.value.message


def test_success_body_outside_the_protocol_raises_protocol_error(
    server: ScriptedEnvServer, client: Client
) -> None:
    server.script.append(Canned(200, b'{"unexpected": true}'))
    with pytest.raises(ProtocolError, match="not a StepResponse"):
        client.step("s-1", "x")


def test_probes_are_tried_once(server: ScriptedEnvServer, client: Client) -> None:
    draining = ReadyResponse(ready=False, active_sessions=1, max_sessions=4, draining=True)
    server.script.append(Canned(503, draining.model_dump_json().encode(), {"retry-after": "1"}))
    assert client.ready() == draining  # a server says why it is not ready
    server.script.append(Canned(503, error_body("draining", "shutting down"), {"retry-after": "1"}))
    with pytest.raises(ServerBusyError, match="draining"):  # a proxy's or an older server's 503
        client.ready()
    assert len(server.requests_to("/ready")) == 2


# --- auth -----------------------------------------------------------------------------------------


def test_bearer_token_comes_from_the_environment_by_default(
    server: ScriptedEnvServer, client_type: type[Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VISTARL_API_TOKEN", "from-env")
    with client_type(server.url) as c:
        c.health()
    with client_type(server.url, token="explicit") as c:
        c.health()
    with client_type(server.url, token="") as c:
        c.health()
    auth = [s.headers.get("authorization") for s in server.requests_to("/health")]
    assert auth == ["Bearer from-env", "Bearer explicit", None]


# --- episodes -------------------------------------------------------------------------------------


def test_episode_plays_and_closes_its_session(server: ScriptedEnvServer, sync_client: EnvClient) -> None:
    with sync_client.episode(seed=3, options={"level": 1}) as ep:
        assert ep.session_id == "s-1" and ep.observation.text == "count=0"
        while not ep.done:
            ep.step("go")
    assert (ep.turns, ep.total_reward, ep.observation.text) == (3, 3.0, "count=3")
    assert json.loads(server.requests_to("/reset")[0].body) == {
        "seed": 3,
        "options": {"level": 1},
        "format": False,
    }
    assert [s.method for s in server.requests_to("/sessions/s-1")] == ["DELETE"]


def test_closing_a_session_already_gone_is_not_an_error(
    server: ScriptedEnvServer, sync_client: EnvClient
) -> None:
    server.script.append(Canned(404, error_body("session_not_found", "expired")))
    assert sync_client.close("s-1") is False
    assert sync_client.close("s-1") is True
    with sync_client.episode():
        server.script.append(Canned(404, error_body("session_not_found", "expired")))
    assert len(server.requests_to("/sessions/s-1")) == 3


def test_episode_close_surfaces_other_errors(server: ScriptedEnvServer, sync_client: EnvClient) -> None:
    with pytest.raises(ServerError), sync_client.episode():
        server.script.append(Canned(500, error_body("internal_error", "boom")))


def test_episode_error_wins_over_a_failing_close(server: ScriptedEnvServer, sync_client: EnvClient) -> None:
    with pytest.raises(KeyError), sync_client.episode():
        server.script.append(Canned(500, error_body("internal_error", "boom")))
        raise KeyError("the agent's own failure")
    assert len(server.requests_to("/sessions/s-1")) == 1


# --- the async client shares the logic; check its own I/O loop ------------------------------------


async def test_async_client_retries_and_plays_an_episode(server: ScriptedEnvServer) -> None:
    server.script.extend([Canned(503, error_body("at_capacity", "full"), {"retry-after": "0"})])
    async with AsyncEnvClient(server.url, token="", retry=FAST) as c:
        async with c.episode(seed=1) as ep:
            server.script.append(Canned(drop_after_apply=True))
            await ep.step("go")
            while not ep.done:
                await ep.step("go")
        assert ep.turns == 3 and server.applied == 3
        assert len(server.requests_to("/reset")) == 2
        assert len(server.requests_to("/step")) == 4
        assert len(server.requests_to("/sessions/s-1")) == 1
        server.script.append(Canned(404, error_body("session_not_found", "gone")))
        with pytest.raises(SessionNotFoundError):
            await c.step("s-1", "go")
        assert await c.close("s-1") is True


# --- the blocking client is a facade over the async one -------------------------------------------


def test_threads_share_one_blocking_client_whose_loop_thread_stops_at_shutdown(
    server: ScriptedEnvServer,
) -> None:
    def loop_threads() -> int:
        return sum(thread.name == "vistarl-env-client" for thread in threading.enumerate())

    before = loop_threads()
    with EnvClient(server.url, token="", retry=FAST) as client:
        assert loop_threads() == before + 1
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda i: client.step("s-1", f"move {i}"), range(24)))
        assert server.applied == 24
        assert sorted(int(a.observation.text.split("=")[1]) for a in answers) == list(range(1, 25))
    assert loop_threads() == before
    with pytest.raises(RuntimeError):
        client.info()
