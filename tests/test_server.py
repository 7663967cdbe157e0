"""The environment server over a real socket: every endpoint, every error path, concurrency and retries.

One `vistarl serve tests.envs.counter` process serves the whole module, once with envs in its threads
and sessions in its memory, and once with two env worker processes and sessions in Redis; each test
opens its own sessions.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families

from tests.envs.counter import BAD_ACTION_PENALTY, CounterOptions
from tests.envs.serving import counter_server
from tests.wire import assert_error, reset, step
from vistarl.clients.images import decode_image, encode_image
from vistarl.clients.protocol import InfoResponse, StepResponse

MAX_BODY = 64 * 1024
MAX_ACTION = 1000
MAX_PIXELS = 64 * 64
KEPT_ANSWERS = 3
TIMEOUT = 30.0


@pytest.fixture(scope="module", params=[0, 2], ids=["threads", "2-env-workers-redis-store"])
def env_workers(request: pytest.FixtureRequest) -> int:
    """The server's `--env-workers`: 0 runs envs in its threads (sessions in its memory); with 2 env
    worker processes, sessions live in Redis (`--session-store`), which must not change a single answer."""
    return int(request.param)


@pytest.fixture(scope="module")
def url(env_workers: int, request: pytest.FixtureRequest) -> Iterator[str]:
    """The server: body and image limits from flags and env vars, small enough to hit in tests."""
    env = {
        "VISTARL_MAX_ACTION_CHARS": str(MAX_ACTION),
        "VISTARL_MAX_IMAGE_PIXELS": str(MAX_PIXELS),
        "VISTARL_IDEMPOTENCY_CACHE_SIZE": str(KEPT_ANSWERS),
        "VISTARL_ENV_TIMEOUT_S": "45",
    }
    if env_workers:
        env["VISTARL_SESSION_STORE"] = request.getfixturevalue("redis_url")
    flags = ("--max-body-bytes", str(MAX_BODY), "--max-sessions", "100", "--env-workers", str(env_workers))
    with counter_server(*flags, env=env) as base:
        yield base


@pytest.fixture
def http(url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=url, timeout=TIMEOUT) as client:
        yield client


def metric_values(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Prometheus text as {(sample name, sorted labels): value}."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


# --- info, health, reset, step ---------------------------------------------------------------------


def test_info_describes_the_env_and_the_limits(http: httpx.Client) -> None:
    info = InfoResponse.model_validate(http.get("/info").json())
    assert info.name == "counter"
    assert info.action_format == "inc"
    assert "You are counting" in info.system_prompt
    assert set(info.config_schema["properties"]) == set(CounterOptions.model_fields)
    assert info.config_schema["additionalProperties"] is False
    assert info.limits.max_body_bytes == MAX_BODY  # from a CLI flag
    assert info.limits.max_image_pixels == MAX_PIXELS  # from a VISTARL_* variable
    assert info.limits.max_action_chars == MAX_ACTION
    assert info.limits.max_sessions == 100
    assert info.limits.idempotency_cache_size == KEPT_ANSWERS
    assert info.limits.env_timeout_s == 45
    assert info.limits.retry_after_s >= 1


def test_health_and_ready(http: httpx.Client) -> None:
    health = http.get("/health")
    assert health.json() == {"status": "healthy"}  # OpenEnv's value, which `openenv validate` checks
    assert "server" not in health.headers  # `vistarl serve` does not advertise uvicorn
    ready = http.get("/ready")
    assert ready.status_code == 200
    assert ready.json()["ready"] is True
    assert ready.json()["max_sessions"] == 100


def test_reset_encodes_images_and_formats_a_message(http: httpx.Client) -> None:
    first = reset(http, seed=5, options={"image_size": 12, "target": 10}, format=True)
    assert first.observation.text.startswith("count=5 steps=0")
    image = decode_image(first.observation.images[0], max_bytes=1 << 20, max_pixels=1 << 20)
    assert image.size == (12, 12)
    assert image.convert("RGB").getpixel((0, 0)) == (5, 0, 0)
    assert first.info == {"target": 10}
    assert first.message is not None
    parts = first.message.model_dump()["content"]
    assert parts[0] == {"type": "image_url", "image_url": {"url": first.observation.images[0]}}
    assert parts[-1] == {"type": "text", "text": first.observation.text}
    other = reset(http)
    assert other.session_id != first.session_id
    assert other.message is None


def test_an_episode_runs_to_done_and_then_refuses_steps(http: httpx.Client) -> None:
    session = reset(http, options={"target": 2}).session_id
    assert step(http, session).reward == 1.0
    bad = step(http, session, action="jump")  # a bad action is the env's business, not an HTTP error
    assert bad.reward == pytest.approx(BAD_ACTION_PENALTY)
    assert bad.done is False
    assert "unknown action" in bad.observation.text
    last = step(http, session, format=True)
    assert last.done is True
    assert last.info["episode_reward"] == pytest.approx(2.0 + BAD_ACTION_PENALTY)
    assert last.info["metrics"] == {"steps": 3, "success": 1.0}
    assert last.message is not None
    after = http.post("/step", json={"session_id": session, "action": "inc"})
    assert_error(after, 409, "episode_done", session)


def test_delete_frees_the_session(http: httpx.Client) -> None:
    session = reset(http).session_id
    assert http.delete(f"/sessions/{session}").status_code == 204
    assert_error(http.delete(f"/sessions/{session}"), 404, "session_not_found", session)
    assert_error(http.post("/step", json={"session_id": session, "action": "inc"}), 404, "session_not_found")


def test_client_chosen_session_id_and_its_conflict(http: httpx.Client) -> None:
    chosen = f"mine-{time.monotonic_ns()}"
    assert reset(http, session_id=chosen).session_id == chosen
    assert step(http, chosen).observation.text.startswith("count=1")
    assert_error(http.post("/reset", json={"session_id": chosen}), 409, "session_exists", chosen)
    http.delete(f"/sessions/{chosen}")
    assert reset(http, session_id=chosen).observation.text.startswith("count=0")


# --- input errors ----------------------------------------------------------------------------------


def test_unknown_session_is_404(http: httpx.Client) -> None:
    assert_error(http.post("/step", json={"session_id": "nope", "action": "inc"}), 404, "session_not_found")


def test_options_are_validated_naming_the_field(http: httpx.Client) -> None:
    assert_error(http.post("/reset", json={"options": {"targt": 3}}), 422, "invalid_options", "options.targt")
    assert_error(
        http.post("/reset", json={"options": {"target": 0}}), 422, "invalid_options", "options.target"
    )
    slow = http.post("/reset", json={"options": {"step_delay_s": "slow"}})
    assert_error(slow, 422, "invalid_options", "options.step_delay_s")
    refused = http.post("/reset", json={"options": {"refuse": "no level fits"}})  # the env's own ValueError
    assert_error(refused, 422, "invalid_options", "no level fits")


def test_malformed_and_invalid_bodies(http: httpx.Client) -> None:
    headers = {"content-type": "application/json"}
    assert_error(http.post("/step", content=b'{"session_id": ', headers=headers), 400, "bad_request", "JSON")
    no_action = http.post("/step", json={"session_id": "x"})
    assert_error(no_action, 422, "validation_error", "body: a step needs action", "or tool_call")
    assert_error(http.post("/reset", json={"seed": "one"}), 422, "validation_error", "body.seed")
    assert_error(http.post("/reset", json={"sed": 1}), 422, "validation_error", "body.sed")


def test_a_body_that_is_not_json_or_empty_is_422(http: httpx.Client) -> None:
    as_text = http.post("/step", content=b'{"session_id": "s"}', headers={"content-type": "text/plain"})
    assert_error(as_text, 422, "validation_error", "Content-Type", "text/plain")
    assert_error(http.post("/reset"), 422, "validation_error", "body")
    charset = {"content-type": "application/json; charset=utf-8"}
    assert http.post("/reset", content=b"{}", headers=charset).status_code == 200


def test_cors_is_off_by_default(http: httpx.Client) -> None:
    preflight = {"Origin": "https://play.example", "Access-Control-Request-Method": "POST"}
    answer = http.options("/reset", headers=preflight)
    assert "access-control-allow-origin" not in answer.headers
    assert (
        "access-control-allow-origin"
        not in http.get("/info", headers={"Origin": "https://play.example"}).headers
    )


def test_unknown_route_and_method(http: httpx.Client) -> None:
    assert_error(http.get("/nowhere"), 404, "not_found")
    assert_error(http.get("/reset"), 405, "bad_request")
    # what the lean routes leave to FastAPI's router answers as the router does
    assert_error(http.put("/step", json={}), 405, "bad_request")
    assert_error(http.post("/sessions/some-id", json={}), 405, "bad_request")
    assert_error(http.delete("/sessions/some-id/more"), 404, "not_found")


def test_action_longer_than_the_limit_is_422(http: httpx.Client) -> None:
    session = reset(http).session_id
    long = http.post("/step", json={"session_id": session, "action": "x" * (MAX_ACTION + 1)})
    assert_error(long, 422, "validation_error", str(MAX_ACTION))
    assert step(http, session, action="x" * MAX_ACTION).reward == pytest.approx(BAD_ACTION_PENALTY)


def test_body_over_the_limit_is_413(http: httpx.Client) -> None:
    body = b'{"session_id": "s", "action": "' + b"x" * MAX_BODY + b'"}'
    assert_error(
        http.post("/step", content=body, headers={"content-type": "application/json"}),
        413,
        "payload_too_large",
    )

    def chunks() -> Iterator[bytes]:  # streamed without Content-Length: counted as it arrives
        for start in range(0, len(body), 4096):
            yield body[start : start + 4096]

    chunked = http.post("/step", content=chunks(), headers={"content-type": "application/json"})
    assert "content-length" not in chunked.request.headers
    assert_error(chunked, 413, "payload_too_large")
    assert http.get("/health").status_code == 200


# --- /format ---------------------------------------------------------------------------------------


def test_format_decodes_and_reencodes_images(http: httpx.Client) -> None:
    image = Image.new("RGB", (16, 16), (1, 2, 3))
    response = http.post("/format", json={"observation": {"text": "look", "images": [encode_image(image)]}})
    assert response.status_code == 200, response.text
    parts = response.json()["message"]["content"]
    assert parts[-1] == {"type": "text", "text": "look"}
    echoed = decode_image(parts[0]["image_url"]["url"], max_bytes=1 << 20, max_pixels=1 << 20)
    assert echoed.size == (16, 16)
    assert echoed.convert("RGB").getpixel((3, 3)) == (1, 2, 3)


@pytest.mark.parametrize(
    ("image", "mention"),
    [
        ("data:image/png;base64,!!!not-base64!!!", "base64"),
        ("data:image/png;base64,aGVsbG8gd29ybGQ=", "not a PNG"),
        (encode_image(Image.new("RGB", (65, 65))), "too large"),
    ],
)
def test_format_rejects_bad_images_with_422(http: httpx.Client, image: str, mention: str) -> None:
    response = http.post("/format", json={"observation": {"text": "t", "images": [image]}})
    assert_error(response, 422, "invalid_image", mention)


# --- failures, retries, concurrency ------------------------------------------------------------------


def test_env_crash_is_500_and_the_server_carries_on(http: httpx.Client) -> None:
    session = reset(http, options={"fail_on": "boom"}).session_id
    assert_error(http.post("/step", json={"session_id": session, "action": "boom"}), 500, "internal_error")
    assert step(http, session).observation.text.startswith("count=1")
    samples = metric_values(http.get("/metrics").text)
    assert samples[("vistarl_env_errors_total", (("code", "internal_error"),))] >= 1


def test_a_retried_step_returns_the_stored_answer(http: httpx.Client) -> None:
    session = reset(http).session_id
    first = step(http, session, request_id="r1")
    again = step(http, session, request_id="r1")
    assert again == first
    assert first.observation.text.startswith("count=1 steps=1")
    assert step(http, session, request_id="r2").observation.text.startswith("count=2 steps=2")


def test_a_request_id_reused_for_another_action_is_refused(http: httpx.Client) -> None:
    session = reset(http).session_id
    first = step(http, session, action="inc", request_id="once")
    reused = http.post("/step", json={"session_id": session, "action": "jump", "request_id": "once"})
    assert_error(reused, 409, "request_id_reused", "once", session)
    assert step(http, session, action="inc", request_id="once") == first  # the real retry still replays
    assert step(http, session).observation.text.startswith("count=2 steps=2")  # nothing stepped meanwhile


def test_a_retried_step_that_ended_the_episode_replays_its_answer(http: httpx.Client) -> None:
    session = reset(http, options={"target": 1}).session_id
    last = step(http, session, request_id="last")
    assert last.done
    assert step(http, session, request_id="last") == last  # not 409: it is the same step
    assert_error(http.post("/step", json={"session_id": session, "action": "inc"}), 409, "episode_done")


def test_a_request_id_evicted_from_the_cache_steps_again(http: httpx.Client) -> None:
    """Only the last `idempotency_cache_size` answers are kept (docs/server.md, "step")."""
    session = reset(http, options={"target": 100}).session_id
    first = step(http, session, request_id="oldest")
    for n in range(KEPT_ANSWERS - 1):
        step(http, session, request_id=f"later-{n}")
    assert step(http, session, request_id="oldest") == first  # still kept
    step(http, session, request_id="pushes-it-out")
    again = step(http, session, request_id="oldest")
    assert again.observation.text.startswith(f"count={KEPT_ANSWERS + 2} ")


async def test_a_concurrent_duplicate_waits_for_the_first(url: str, http: httpx.Client) -> None:
    session = reset(http, options={"step_delay_s": 0.5, "target": 10}).session_id
    body = {"session_id": session, "action": "inc", "request_id": "dup"}
    async with httpx.AsyncClient(base_url=url, timeout=TIMEOUT) as client:
        one, two = await asyncio.gather(client.post("/step", json=body), client.post("/step", json=body))
    assert one.status_code == two.status_code == 200
    assert one.json() == two.json()
    assert one.json()["observation"]["text"].startswith("count=1 steps=1")
    assert step(http, session).observation.text.startswith("count=2 steps=2")


async def test_steps_of_one_session_are_serialized(url: str, http: httpx.Client, tmp_path: Path) -> None:
    """Five steps sent at once: each ran alone (the counter env counts the steps running beside it)."""
    n = 5
    options = {"step_delay_s": 0.2, "target": 100, "in_step_dir": str(tmp_path)}
    session = reset(http, options=options).session_id
    body = {"session_id": session, "action": "inc"}
    async with httpx.AsyncClient(base_url=url, timeout=TIMEOUT) as client:
        answers = await asyncio.gather(*(client.post("/step", json=body) for _ in range(n)))
    stepped = [StepResponse.model_validate(a.json()) for a in answers]
    counts = sorted(s.observation.text.split()[0] for s in stepped)
    assert counts == [f"count={i}" for i in range(1, n + 1)]  # no lost or doubled update
    assert [(s.info["met"], s.info["running"]) for s in stepped] == [(1, 1)] * n  # one at a time


async def test_different_sessions_step_concurrently(
    url: str, http: httpx.Client, env_workers: int, tmp_path: Path
) -> None:
    """Threads overlap any sessions' steps; env workers overlap those of sessions in different workers
    (new sessions go to the worker with the fewest), and run one call at a time each. Each step waits
    until as many steps run at once as should (a rendezvous in the counter env), and reports how many
    ran beside it: all four sessions' with threads, one per worker with workers."""
    n = 4
    meet = env_workers or n
    options = {"step_delay_s": 0.2, "in_step_dir": str(tmp_path), "meet": meet}
    sessions = [reset(http, options=options).session_id for _ in range(n)]
    async with httpx.AsyncClient(base_url=url, timeout=TIMEOUT) as client:
        answers = await asyncio.gather(
            *(client.post("/step", json={"session_id": s, "action": "inc"}) for s in sessions)
        )
    infos = [StepResponse.model_validate(a.json()).info for a in answers]
    assert [info["met"] for info in infos] == [meet] * n, infos  # as many at once as the workers allow
    assert max(info["running"] for info in infos) <= meet, infos  # and never more
    for session in sessions:
        http.delete(f"/sessions/{session}")


def test_metrics_count_resets_steps_and_errors(http: httpx.Client) -> None:
    before = metric_values(http.get("/metrics").text)
    session = reset(http).session_id
    step(http, session)
    step(http, session)
    http.post("/step", json={"session_id": "missing", "action": "inc"})
    response = http.get("/metrics")
    assert response.headers["content-type"].startswith("text/plain")
    after = metric_values(response.text)

    def grew(name: str, labels: tuple[tuple[str, str], ...] = ()) -> float:
        return after[(name, labels)] - before.get((name, labels), 0.0)

    assert grew("vistarl_env_resets_total") == 1
    assert grew("vistarl_env_steps_total") == 2
    assert grew("vistarl_env_step_seconds_count") == 2
    assert grew("vistarl_env_errors_total", (("code", "session_not_found"),)) == 1
    assert after[("vistarl_env_active_sessions", ())] >= 1
