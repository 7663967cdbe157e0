"""Env handles: in-process env modules and real env servers give the same messages, and fail as EnvError."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import AsyncIterator, Iterator

import pytest

from clients.http import RetryPolicy
from tests.servers import free_port, running_process, stop_process, vistarl_cmd
from trainer.rollout.env_handle import EnvError, LocalEnvHandle, RemoteEnvHandle, RemoteEnvs, is_url, open_env
from trainer.rollout.job import EpisodeJob
from trainer.rollout.rewards import env_reward, load_reward_fn

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
async def remotes() -> AsyncIterator[RemoteEnvs]:
    pool = RemoteEnvs(token="", retry=RetryPolicy(max_attempts=3, base_delay=0.05, deadline_s=5.0))
    yield pool
    await pool.aclose()


def start(**fields: object) -> EpisodeJob:
    """A job that starts an episode as `fields` say (seed, options, sample, task_id)."""
    return EpisodeJob.model_validate({"episode_id": "e", "group_id": "g", "env": "test", **fields})


def image_urls(message: dict) -> list[str]:
    return [part["image_url"]["url"] for part in message["content"] if part["type"] == "image_url"]


async def play(handle, actions: list[str], **reset: object) -> list[tuple]:
    """Reset and step through `actions`, closing the handle; every result in order."""
    try:
        results: list[tuple] = [await handle.reset(start(**reset))]
        for action in actions:
            results.append(await handle.step(action))
        return results
    finally:
        await handle.close()


async def test_local_and_remote_give_the_same_episode(sokoban_url: str, remotes: RemoteEnvs) -> None:
    actions = ["<answer>Left</answer>", "<answer>Up, Right</answer>", "<answer>Down</answer>"]
    local = open_env("services.sokoban")
    remote = open_env(sokoban_url, remotes)
    assert isinstance(local, LocalEnvHandle) and isinstance(remote, RemoteEnvHandle)
    local_results = await play(local, actions, seed=7)
    remote_results = await play(remote, actions, seed=7)
    assert local_results == remote_results
    assert local.system_prompt == remote.system_prompt != ""
    first_message = local_results[0][0]
    assert first_message["role"] == "user"
    assert [part["type"] for part in first_message["content"]] == ["image_url", "text"]
    assert image_urls(first_message)[0].startswith("data:image/png;base64,")
    rewards = [result[1] for result in local_results[1:]]
    assert all(isinstance(reward, float) for reward in rewards)


async def test_a_solved_level_reports_done_and_the_env_reward(sokoban_url: str, remotes: RemoteEnvs) -> None:
    for handle in (open_env("sokoban"), open_env(sokoban_url, remotes)):
        results = await play(handle, ["<answer>Right</answer>"], options=SOLVABLE)
        _, reward, done, info = results[-1]
        assert done and reward == pytest.approx(1.0 + 0.01)
        assert info["episode_reward"] == pytest.approx(env_reward([reward], info))
        sokoban_reward = load_reward_fn("services.sokoban.reward")
        assert sokoban_reward([reward], info) == pytest.approx(info["episode_reward"])


async def test_remote_close_deletes_the_session(sokoban_url: str, remotes: RemoteEnvs) -> None:
    handle = open_env(sokoban_url, remotes)
    assert isinstance(handle, RemoteEnvHandle)
    await handle.reset(start(seed=1))
    session_id = handle.session_id
    await handle.close()
    await handle.close()
    assert session_id is not None
    assert await remotes.client(sokoban_url).close(session_id) is False


async def test_bad_options_fail_as_env_errors(sokoban_url: str, remotes: RemoteEnvs) -> None:
    for handle in (open_env("sokoban"), open_env(sokoban_url, remotes)):
        with pytest.raises(EnvError, match="no_such_option"):
            await handle.reset(start(options={"no_such_option": 1}))
        await handle.close()


async def test_a_raising_env_fails_as_an_env_error() -> None:
    handle = open_env("tests.envs.counter")
    await handle.reset(start(options={"fail_on": "boom"}))
    with pytest.raises(EnvError, match="told to fail"):
        await handle.step("boom")
    await handle.close()


async def test_a_hanging_env_step_times_out() -> None:
    handle = LocalEnvHandle("tests.envs.counter", timeout_s=0.2)
    await handle.reset(start(options={"step_delay_s": 2.0}))
    started = time.monotonic()
    with pytest.raises(EnvError, match="timed out"):
        await handle.step("inc")
    assert time.monotonic() - started < 1.5
    await handle.close()


async def test_a_dead_env_server_fails_within_the_retry_budget(remotes: RemoteEnvs) -> None:
    with env_process("tests.envs.counter") as (url, proc):
        handle = open_env(url, remotes)
        await handle.reset(start())
        await handle.step("inc")
        stop_process(proc)
    started = time.monotonic()
    with pytest.raises(EnvError, match="step failed"):
        await handle.step("inc")
    await handle.close()
    assert time.monotonic() - started < 10.0


async def test_local_sample_goes_through_build_env() -> None:
    sample = {"extra_info": {"env_config": {"xsb": SOLVABLE["xsb"], "render_mode": "text"}}}
    results = await play(open_env("sokoban"), ["right"], sample=sample)
    first_message, _ = results[0]
    assert image_urls(first_message) == []
    assert "#@$.#" in first_message["content"][-1]["text"]
    assert results[-1][2] is True


async def test_remote_refuses_a_sample(sokoban_url: str, remotes: RemoteEnvs) -> None:
    handle = open_env(sokoban_url, remotes)
    with pytest.raises(EnvError, match="not a dataset sample"):
        await handle.reset(start(sample={"extra_info": {}}))


def test_open_env_picks_by_spec() -> None:
    assert is_url("http://x:1") and is_url("https://x") and not is_url("services.sokoban")
    with pytest.raises(EnvError, match="unknown environment"):
        open_env("no_such_env_module")
    with pytest.raises(ValueError, match="RemoteEnvs"):
        open_env("http://127.0.0.1:1")


def test_reward_paths_resolve_three_ways() -> None:
    from services.sokoban.reward import reward

    assert load_reward_fn("services.sokoban.reward") is reward
    assert load_reward_fn("services.sokoban.reward:reward") is reward
    assert load_reward_fn("services.sokoban.reward.episode_reward").__name__ == "episode_reward"
    assert load_reward_fn(None) is env_reward
    assert env_reward([0.5, 0.25], {}) == 0.75
    assert env_reward([0.5], {"episode_reward": 3}) == 3.0
    for bad, match in [
        ("no_such_pkg.mod:fn", "cannot import"),
        ("services.sokoban.reward:nope", "no function 'nope'"),
        ("services.sokoban.nope_module", "no function .nope_module."),
        (":fn", "must look like"),
    ]:
        with pytest.raises(ValueError, match=match):
            load_reward_fn(bad)
