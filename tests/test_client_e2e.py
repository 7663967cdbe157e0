"""Episodes through `EnvClient` and `AsyncEnvClient` against `vistarl serve tests.envs.counter`.

One real server process (bearer token on, small body limit, four session slots) serves the module.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import pytest

from vistarl.clients import (
    AsyncEnvClient,
    AuthError,
    BadRequestError,
    EnvClient,
    EpisodeDoneError,
    PayloadTooLargeError,
    RetryPolicy,
    SessionExistsError,
    SessionNotFoundError,
    decode_image,
)
from vistarl.clients.protocol import ImagePart, TextPart
from vistarl.devtools.servers import running_process, vistarl_cmd
from vistarl.httpserver.launch import free_port

TOKEN = "e2e-secret"
MAX_SESSIONS = 4
MAX_BODY = 65_536


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    port = free_port()
    args = vistarl_cmd(
        "serve", "tests.envs.counter", "--host", "127.0.0.1", "--port", str(port),
        "--max-sessions", str(MAX_SESSIONS), "--max-body-bytes", str(MAX_BODY), "--log-level", "warning",
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    with running_process(args, ready_url=f"{url}/health", env={"VISTARL_API_TOKEN": TOKEN}):
        yield url


@pytest.fixture
def client(server_url: str) -> Iterator[EnvClient]:
    with EnvClient(server_url, token=TOKEN, timeout=10.0) as c:
        yield c


def test_sync_episode_plays_to_the_end_and_frees_its_session(client: EnvClient) -> None:
    with client.episode(seed=0, options={"target": 3}, format=True) as ep:
        assert ep.observation.text.startswith("count=0")
        assert ep.message is not None and ep.message.role == "user"
        first = ep.step("inc")
        assert (first.reward, first.done) == (1.0, False)
        assert decode_image(first.observation.images[0]).getpixel((0, 0)) == (1, 0, 0)
        while not ep.done:
            ep.step("inc")
    assert (ep.turns, ep.total_reward) == (3, 3.0)
    assert ep.info["episode_reward"] == 3.0
    assert ep.info["metrics"]["success"] == 1.0
    with pytest.raises(SessionNotFoundError) as err:
        client.step(ep.session_id, "inc")
    assert err.value.status == 404
    assert client.close(ep.session_id) is False


def test_a_bad_action_is_feedback_not_an_error(client: EnvClient) -> None:
    with client.episode() as ep:
        result = ep.step("jump")
        assert result.reward == pytest.approx(-0.1)
        assert "unknown action" in result.observation.text


def test_a_step_sent_twice_with_one_request_id_is_applied_once(client: EnvClient) -> None:
    with client.episode(options={"target": 5}) as ep:
        once = client.step(ep.session_id, "inc", request_id="same-id")
        again = client.step(ep.session_id, "inc", request_id="same-id")
        assert again == once
        assert ep.step("inc").observation.text.startswith("count=2")


def test_format_returns_the_envs_chat_message(client: EnvClient) -> None:
    with client.episode() as ep:
        message = client.format(ep.observation)
    assert message.role == "user" and isinstance(message.content, list)
    image, text = message.content
    assert isinstance(image, ImagePart) and image.image_url.url == ep.observation.images[0]
    assert isinstance(text, TextPart) and text.text == ep.observation.text


def test_info_publishes_the_servers_limits(client: EnvClient) -> None:
    info = client.info()
    assert info.name == "counter"
    assert (info.limits.max_sessions, info.limits.max_body_bytes) == (MAX_SESSIONS, MAX_BODY)
    assert "target" in info.config_schema["properties"]


def test_server_errors_arrive_as_typed_exceptions(client: EnvClient, server_url: str) -> None:
    with pytest.raises(BadRequestError) as bad_options:
        client.reset(options={"targett": 3})
    assert bad_options.value.status == 422 and "targett" in bad_options.value.message

    with client.episode(options={"target": 1}, session_id="e2e-fixed") as ep:
        with pytest.raises(SessionExistsError):
            client.reset(session_id="e2e-fixed")
        assert ep.step("inc").done
        with pytest.raises(EpisodeDoneError) as done:
            ep.step("inc")
        assert (done.value.status, done.value.code) == (409, "episode_done")
        with pytest.raises(PayloadTooLargeError) as too_large:
            ep.step("x" * (2 * MAX_BODY))
        assert too_large.value.status == 413

    for token in ("wrong", ""):
        with EnvClient(server_url, token=token) as stranger, pytest.raises(AuthError) as denied:
            stranger.info()
        assert (denied.value.status, denied.value.code) == (401, "unauthorized")


async def test_async_episodes_beyond_capacity_wait_for_a_slot_and_all_finish(
    server_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    n_episodes = 3 * MAX_SESSIONS
    retry = RetryPolicy(max_attempts=30, base_delay=0.1, max_delay=1.0, deadline_s=90.0)

    async def play(client: AsyncEnvClient) -> float:
        async with client.episode(options={"target": 3, "step_delay_s": 0.05}) as ep:
            while not ep.done:
                await ep.step("inc")
            return ep.total_reward

    caplog.set_level(logging.INFO, logger="vistarl.clients.http")
    async with AsyncEnvClient(server_url, token=TOKEN, retry=retry) as client:
        rewards = await asyncio.gather(*(play(client) for _ in range(n_episodes)))
        assert rewards == [3.0] * n_episodes
        ready = await client.ready()
        assert ready.active_sessions == 0
    assert any("POST /reset: 503" in record.getMessage() for record in caplog.records)
