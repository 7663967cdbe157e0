"""Env handles: an env module in process and an env server give the same episodes, and fail as EnvError."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import subprocess
from collections.abc import AsyncIterator, Iterator

import pytest

from tests.retries import retry_waits
from tests.runners import SETTINGS
from vistarl.clients.protocol import ResetResponse, StepResponse
from vistarl.devtools.servers import running_process, vistarl_cmd
from vistarl.httpserver.launch import free_port, stop_process
from vistarl.trainer.rollout.env_handle import EnvHandle, Envs, is_url
from vistarl.trainer.rollout.episode_env import EnvError
from vistarl.trainer.rollout.job import EpisodeJob
from vistarl.trainer.rollout.rewards import env_reward, load_reward_fn

SOLVABLE = {"xsb": "#####\n#@$.#\n#####"}


@contextlib.contextmanager
def env_process(name: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """`vistarl serve NAME` on a free loopback port, without a bearer token; yields (URL, process)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = vistarl_cmd("serve", name, "--port", str(port), "--log-level", "warning")
    with running_process(args, ready_url=f"{url}/health", env={"VISTARL_API_TOKEN": ""}) as proc:
        yield url, proc


@pytest.fixture(scope="module")
def sokoban_url() -> Iterator[str]:
    with env_process("sokoban") as (url, _):
        yield url


@pytest.fixture
async def envs() -> AsyncIterator[Envs]:
    opened = Envs(token="", timeout_s=5.0, outage_s=3.0)
    yield opened
    await opened.aclose()


def start(**fields: object) -> EpisodeJob:
    """A job that starts an episode as `fields` say (seed, options, sample, task_id)."""
    return EpisodeJob.model_validate(
        {"episode_id": "e", "group_id": "g", "env": "test", "settings": SETTINGS, **fields}
    )


def image_urls(message: dict) -> list[str]:
    return [part["image_url"]["url"] for part in message["content"] if part["type"] == "image_url"]


async def play(handle: EnvHandle, actions: list[str], **reset: object) -> list[tuple]:
    """Reset and step through `actions`, closing the handle; every result in order."""
    try:
        results: list[tuple] = [await handle.reset(start(**reset))]
        for action in actions:
            results.append(await handle.step(action))
        return results
    finally:
        await handle.close()


async def test_in_process_and_remote_give_the_same_episode(sokoban_url: str, envs: Envs) -> None:
    actions = ["<answer>Left</answer>", "<answer>Up, Right</answer>", "<answer>Down</answer>"]
    local = await envs.open("vistarl.services.sokoban")
    remote = await envs.open(sokoban_url)
    local_results = await play(local, actions, seed=11, options={"max_steps": 50})
    remote_results = await play(remote, actions, seed=11, options={"max_steps": 50})
    assert local_results == remote_results
    assert local.system_prompt == remote.system_prompt != ""
    first_message, _ = local_results[0]
    assert first_message["role"] == "user"
    assert image_urls(first_message)[0].startswith("data:image/png;base64,")
    rewards = [answer.reward for _, answer in local_results[1:]]
    assert all(isinstance(r, float) for r in rewards)


async def test_in_process_answers_are_the_responses_themselves_not_json_parsed_back(
    envs: Envs, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(body: bytes) -> None:
        raise AssertionError("an in-process answer was parsed from JSON")

    for model in (ResetResponse, StepResponse):
        monkeypatch.setattr(model, "model_validate_json", refuse)
    results = await play(await envs.open("sokoban"), ["<answer>Left</answer>"], seed=3)
    assert isinstance(results[-1][1], StepResponse)


async def test_a_solved_level_reports_done_and_the_env_reward(sokoban_url: str, envs: Envs) -> None:
    for spec in ("sokoban", sokoban_url):
        results = await play(await envs.open(spec), ["<answer>Right</answer>"], options=SOLVABLE)
        _, answer = results[-1]
        reward, info = answer.reward, answer.info
        assert (
            answer.terminated and not answer.truncated and info["success"] and reward == pytest.approx(1.01)
        )
        assert env_reward([reward], info) == info["episode_reward"]
        assert load_reward_fn("vistarl.services.sokoban.reward")([reward], info) == info["episode_reward"]


async def test_close_ends_the_session(sokoban_url: str, envs: Envs) -> None:
    for spec in ("sokoban", sokoban_url):
        handle = await envs.open(spec)
        await handle.reset(start(seed=1))
        session_id = handle.session_id
        assert session_id is not None
        await handle.close()
        await handle.close()
        assert await handle.sessions.close(session_id) is False, "the session was already deleted"


async def test_bad_options_and_env_failures_are_env_errors(sokoban_url: str, envs: Envs) -> None:
    for spec in ("sokoban", sokoban_url):
        with pytest.raises(EnvError, match=r"reset failed.*no_such_option"):
            await (await envs.open(spec)).reset(start(options={"no_such_option": 1}))
    handle = await envs.open("tests.envs.counter")
    await handle.reset(start(options={"fail_on": "boom"}))
    with pytest.raises(EnvError, match="step failed"):
        await handle.step("boom")
    await handle.close()


async def test_a_hanging_env_times_out_as_an_env_error() -> None:
    envs = Envs(timeout_s=0.2)
    handle = await envs.open("tests.envs.counter")
    await handle.reset(start(options={"step_delay_s": 10.0}))
    with pytest.raises(EnvError, match=r"step failed: .*step exceeded 0\.2s"):  # not the 10 s step's end
        await handle.step("inc")
    await handle.close()
    await envs.aclose()


async def test_a_dead_env_server_fails_within_the_outage_budget(
    envs: Envs, caplog: pytest.LogCaptureFixture
) -> None:
    """The step is retried until the 3 s outage budget (its attempts are not what bound it): the waits
    fit in the budget, and the error counts the attempts."""
    caplog.set_level(logging.INFO, logger="vistarl.clients.http")
    with env_process("tests.envs.counter") as (url, proc):
        handle = await envs.open(url)
        await handle.reset(start())
        await handle.step("inc")
        stop_process(proc)
    with pytest.raises(EnvError, match="step failed") as failed:
        await handle.step("inc")
    waits = retry_waits(caplog.records)
    await handle.close()
    assert len(waits) >= 2 and sum(waits) < 3.0 and f"after {len(waits) + 1} attempt(s)" in str(failed.value)


async def test_an_env_server_that_comes_back_within_the_outage_budget_is_waited_for() -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    envs = Envs(token="", outage_s=60.0)
    handle = await envs.open(url)
    reset = asyncio.create_task(handle.reset(start(options={"target": 1})))
    await asyncio.sleep(1.0)
    assert not reset.done(), "nothing listens yet: the reset must still be retrying"
    args = vistarl_cmd("serve", "tests.envs.counter", "--port", str(port), "--log-level", "warning")
    with running_process(args, ready_url=f"{url}/health", env={"VISTARL_API_TOKEN": ""}):
        _, info = await asyncio.wait_for(reset, timeout=30.0)
        assert info == {"target": 1}
        assert (await handle.step("inc"))[1].done is True
        await handle.close()
    await envs.aclose()


async def test_a_dataset_sample_starts_the_same_episode_in_process_and_remotely(
    sokoban_url: str, envs: Envs
) -> None:
    sample = {"extra_info": {"env_config": {"xsb": SOLVABLE["xsb"], "render_mode": "text"}}}
    for spec in ("sokoban", sokoban_url):
        results = await play(await envs.open(spec), ["right"], sample=sample)
        first_message, _ = results[0]
        assert image_urls(first_message) == []
        assert "#@$.#" in first_message["content"][-1]["text"]
        assert results[-1][1].done is True
        with pytest.raises(EnvError, match="extra_info"):
            await (await envs.open(spec)).reset(start(sample={"extra_info": {}}))


async def test_specs_pick_the_place(envs: Envs) -> None:
    assert is_url("http://x:1") and is_url("https://x") and not is_url("vistarl.services.sokoban")
    with pytest.raises(EnvError, match="unknown environment"):
        await envs.open("no_such_env_module")
