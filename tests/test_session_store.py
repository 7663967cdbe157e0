"""Sessions in the session store, over real sockets: finished sessions free their slot at once (in memory and
in Redis), and replicas sharing one Redis serve any session's steps, each step applied once.

Servers are real `vistarl serve tests.envs.counter` processes on one private redis-server (conftest's
`redis_url`); the two replicas are one with envs in threads and one with an env worker process, so a
session moves between both kinds of env pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest

from tests.envs.serving import counter_process, counter_server
from tests.servers import children, metric, wait_until
from tests.wire import assert_error, reset, step
from vistarl.clients.protocol import StepResponse
from vistarl.devtools.servers import redis_server

TIMEOUT = 30.0
MAX_SESSIONS = 2
TOMBSTONE_TTL = 1.0
RESTORED = "vistarl_env_restored_sessions_total"
RESTARTS = "vistarl_env_worker_restarts_total"


@pytest.fixture(params=["memory", "redis"])
def store_flags(request: pytest.FixtureRequest, redis_url: str) -> tuple[str, ...]:
    """The server's session store: in its process, or the test Redis."""
    return () if request.param == "memory" else ("--session-store", redis_url)


@pytest.fixture(scope="module")
def replica_b(redis_url: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """Replica `b` of the counter env: one env worker process, reaping every 0.1 s; (URL, process)."""
    flags = ("--session-store", redis_url, "--reaper-interval", "0.1", "--env-workers", "1")
    with counter_process(*flags) as served:
        yield served


@pytest.fixture(scope="module")
def replicas(redis_url: str, replica_b: tuple[str, subprocess.Popen[bytes]]) -> Iterator[tuple[str, str]]:
    """Replicas `a` (envs in threads) and `b` of the counter env on one Redis."""
    with counter_server("--session-store", redis_url, "--reaper-interval", "0.1") as a:
        yield a, replica_b[0]


def count(answer: StepResponse) -> int:
    """The counter's count, from an observation's text `count=N ...`."""
    return int(answer.observation.text.split()[0].removeprefix("count="))


def test_finished_sessions_free_their_slot_at_once(store_flags: tuple[str, ...]) -> None:
    """An agent that resets after `done` without DELETE is never refused (docs/server.md, "Tombstones")."""
    flags = (*store_flags, "--max-sessions", str(MAX_SESSIONS), "--tombstone-ttl", str(TOMBSTONE_TTL))
    with counter_server(*flags) as url, httpx.Client(base_url=url, timeout=TIMEOUT) as http:
        finished = []
        for episode in range(3 * MAX_SESSIONS):
            session = reset(http, session_id=f"agent-{uuid.uuid4().hex}", options={"target": 2}).session_id
            step(http, session, request_id=f"{episode}-first")
            last = step(http, session, request_id=f"{episode}-last")
            assert last.done and last.info["episode_reward"] == 2.0
            assert http.get("/ready").json()["active_sessions"] == 0
            finished.append((session, f"{episode}-last", last))

        session, request_id, last = finished[-1]
        assert step(http, session, request_id=request_id) == last  # the retry of the final step replays
        reused = http.post("/step", json={"session_id": session, "action": "dec", "request_id": request_id})
        assert_error(reused, 409, "request_id_reused", request_id)
        assert_error(http.post("/step", json={"session_id": session, "action": "inc"}), 409, "episode_done")
        assert_error(http.post("/reset", json={"session_id": session}), 409, "session_exists")

        deleted = finished[0][0]
        assert http.delete(f"/sessions/{deleted}").status_code == 204  # a tombstone deleted frees its id
        assert reset(http, session_id=deleted).session_id == deleted
        assert http.delete(f"/sessions/{deleted}").status_code == 204
        time.sleep(TOMBSTONE_TTL + 0.2)
        gone = http.post("/step", json={"session_id": session, "action": "inc", "request_id": request_id})
        assert_error(gone, 404, "session_not_found", session)
        assert reset(http, session_id=session).session_id == session


@pytest.fixture
def on(replicas: tuple[str, str]) -> Iterator[dict[str, httpx.Client]]:
    """A client of each replica, by name."""
    a, b = replicas
    with httpx.Client(base_url=a, timeout=TIMEOUT) as on_a, httpx.Client(base_url=b, timeout=TIMEOUT) as on_b:
        yield {"a": on_a, "b": on_b}


def test_a_session_is_stepped_on_either_replica_and_moves_back(
    replicas: tuple[str, str], on: dict[str, httpx.Client]
) -> None:
    restored = {name: metric(str(on[name].base_url), RESTORED) for name in on}
    session = reset(on["b"], options={"target": 10}).session_id
    turns = [("b", "held on b"), ("a", "restored on a"), ("a", "held on a"), ("b", "b's copy is stale")]
    for turn, (name, why) in enumerate(turns, start=1):
        assert count(step(on[name], session)) == turn, why
    for name in on:
        assert metric(str(on[name].base_url), RESTORED) == restored[name] + 1
    assert wait_until(lambda: on["a"].get("/ready").json()["active_sessions"] == 0)  # a's copy went stale


async def test_concurrent_steps_on_two_replicas_apply_each_step_once(
    replicas: tuple[str, str], on: dict[str, httpx.Client]
) -> None:
    """Twins (one request_id) sent to both replicas at once step once; two different steps sent at once
    both step, one after the other: each replica steps from the stored version, and a commit that finds
    the version moved starts over from the stored state."""
    session = reset(on["a"], options={"target": 10, "step_delay_s": 0.5}).session_id
    async with httpx.AsyncClient(timeout=TIMEOUT) as client:

        async def send(url: str, request_id: str) -> StepResponse:
            body = {"session_id": session, "action": "inc", "request_id": request_id}
            response = await client.post(f"{url}/step", json=body)
            assert response.status_code == 200, response.text
            return StepResponse.model_validate_json(response.content)

        a, b = replicas
        twins = await asyncio.gather(send(a, "twin"), send(b, "twin"))
        assert twins[0] == twins[1] and count(twins[0]) == 1
        both = await asyncio.gather(send(a, "one"), send(b, "two"))
        assert sorted(count(answer) for answer in both) == [2, 3]
        assert count(await send(b, "after")) == 4


def test_a_session_deleted_on_one_replica_is_gone_on_the_other(on: dict[str, httpx.Client]) -> None:
    def held_on_a() -> int:
        return int(on["a"].get("/ready").json()["active_sessions"])

    assert wait_until(lambda: held_on_a() == 0)  # the stale copies of earlier tests' sessions are reaped
    session = reset(on["a"]).session_id
    step(on["a"], session)
    assert held_on_a() == 1
    assert on["b"].delete(f"/sessions/{session}").status_code == 204
    gone = on["a"].post("/step", json={"session_id": session, "action": "inc"})
    assert_error(gone, 404, "session_not_found", session)
    assert held_on_a() == 0  # the 404 released a's env too


def test_with_the_store_a_dead_env_worker_loses_no_session(
    replica_b: tuple[str, subprocess.Popen[bytes]], on: dict[str, httpx.Client]
) -> None:
    """The envs of a killed env worker are restored from Redis in its replacement: the sessions go on
    (docs/server.md, "Env worker processes")."""
    url, proc = replica_b
    restarts, restored = (metric(url, name) for name in (RESTARTS, RESTORED))
    sessions = [reset(on["b"], options={"target": 10}).session_id for _ in range(2)]
    assert [count(step(on["b"], session)) for session in sessions] == [1, 1]
    os.kill(children(proc.pid)[0], signal.SIGKILL)
    assert wait_until(lambda: metric(url, RESTARTS) == restarts + 1)
    assert [count(step(on["b"], session)) for session in sessions] == [2, 2]
    assert metric(url, RESTORED) == restored + 2


def test_while_redis_is_down_session_calls_answer_503_store_unavailable() -> None:
    with contextlib.ExitStack() as redis_alive:
        url = redis_alive.enter_context(redis_server())
        with counter_server("--session-store", url) as server, httpx.Client(base_url=server) as http:
            session = reset(http).session_id
            redis_alive.close()
            down = http.post("/step", json={"session_id": session, "action": "inc"}, timeout=TIMEOUT)
            assert_error(down, 503, "store_unavailable", "session store")
            assert down.headers["retry-after"] == "1"
            assert_error(http.post("/reset", json={}, timeout=TIMEOUT), 503, "store_unavailable")
            assert http.get("/health").status_code == 200
