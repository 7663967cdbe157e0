"""The episode loop with the scripted engine: statuses, budgets, image order, local vs remote, failures."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from tests.runners import trajectory_for
from tests.test_env_handle import env_process, image_urls
from vistarl.clients.http import AsyncEnvClient
from vistarl.httpserver.launch import free_port
from vistarl.services.sokoban.reward import reward as sokoban_reward
from vistarl.trainer.config import RolloutConfig
from vistarl.trainer.rollout.engines.base import Engine, GenerateRequest
from vistarl.trainer.rollout.engines.scripted import ScriptedEngine
from vistarl.trainer.rollout.engines.sglang import SGLangEngine
from vistarl.trainer.rollout.env_handle import Envs
from vistarl.trainer.rollout.episode import run_episode
from vistarl.trainer.rollout.job import EpisodeJob, EpisodeSettings, group_jobs
from vistarl.trainer.rollout.processor import VLProcessor
from vistarl.trainer.rollout.runner import RolloutRunner, run_jobs
from vistarl.trainer.rollout.trajectory import Behaviour, Status, Trajectory

# The player walks right and pushes the box three cells onto the target: four moves, two turns.
CORRIDOR = {"xsb": "########\n#@ $  .#\n########"}
TWO_MOVES = "<answer>Right, Right</answer>"
WANDER = ["<answer>Up</answer>", "<answer>Down</answer>", "<answer>Left</answer>", "<answer>Right</answer>"]


@pytest.fixture(scope="module")
def processor(tiny_qwen25: Path) -> VLProcessor:
    return VLProcessor.from_pretrained(tiny_qwen25)


@pytest.fixture(scope="module")
def sokoban() -> Iterator[tuple[str, Any]]:
    with env_process("sokoban") as served:
        yield served


@pytest.fixture
async def envs() -> AsyncIterator[Envs]:
    opened = Envs(token="", timeout_s=5.0, outage_s=3.0)
    yield opened
    await opened.aclose()


def job(env: str = "sokoban", rollout: RolloutConfig | None = None, **fields: Any) -> EpisodeJob:
    """Episode e1 on `env`, with the settings of `rollout` (a default config) unless `fields` give them."""
    settings = EpisodeSettings.of(rollout or RolloutConfig())
    return EpisodeJob(**{"episode_id": "e1", "group_id": "g1", "env": env, "settings": settings, **fields})


def wander(index: int, request: GenerateRequest) -> str:
    """Moves that never solve a generated level within a few turns."""
    return WANDER[index % len(WANDER)]


async def play(
    processor: VLProcessor,
    engine: Engine,
    envs: Envs,
    env: str = "sokoban",
    config: RolloutConfig | None = None,
    **job_fields: Any,
) -> Trajectory:
    handle = await envs.open(env)
    return await run_episode(handle, engine, processor, job(env, config, **job_fields))


def config(**fields: Any) -> RolloutConfig:
    return RolloutConfig(**{"max_new_tokens": 64, "rollout_max_response_len": 256, **fields})


async def test_valid_moves_complete_the_level_with_its_reward(
    processor: VLProcessor, sokoban: tuple[str, Any], envs: Envs
) -> None:
    for env in ("sokoban", sokoban[0]):
        engine = ScriptedEngine(processor, [TWO_MOVES, TWO_MOVES])
        trajectory = await play(processor, engine, envs, env, options=CORRIDOR)
        assert trajectory.status is Status.COMPLETED and trajectory.error is None
        assert trajectory.turn_rewards == pytest.approx([0.02, 1.02])
        assert trajectory.episode_reward == pytest.approx(0.52 + 5 + 3)
        assert trajectory.metrics["env/success"] == 1.0
        assert trajectory.metrics["turns"] == 2 and trajectory.metrics["finish_stop"] == 2
        assert [m["role"] for m in trajectory.messages] == [
            "system",
            "user",
            "assistant",
            "user",
            "assistant",
        ]
        assert trajectory.messages[-1]["content"] == TWO_MOVES
        assert trajectory.loss_mask[-1] == 1 and trajectory.train_ids[-1] == processor.ids.im_end
        assert set(trajectory.timings) == {"env", "env_reset", "generate", "tokenize", "total"}
        assert 0 < trajectory.timings["env_reset"] < trajectory.timings["env"]  # a step came after it


async def test_a_configured_reward_function_replaces_the_envs(processor: VLProcessor, envs: Envs) -> None:
    engine = ScriptedEngine(processor, [TWO_MOVES, TWO_MOVES])
    handle = await envs.open("sokoban")

    def halved(turn_rewards: Any, info: Any) -> float:
        return sokoban_reward(turn_rewards, info) / 2

    trajectory = await run_episode(handle, engine, processor, job(options=CORRIDOR), reward_fn=halved)
    assert trajectory.episode_reward == pytest.approx((0.52 + 5 + 3) / 2)


async def test_max_turns_truncates_a_game_in_progress(processor: VLProcessor, envs: Envs) -> None:
    trajectory = await play(
        processor, ScriptedEngine(processor, wander), envs, config=config(max_turns=3), seed=5
    )
    assert trajectory.status is Status.TRUNCATED
    assert trajectory.error == "the turn budget of 3 turns is spent"
    assert len(trajectory.turn_rewards) == 3 and trajectory.metrics["turns"] == 3
    assert trajectory.metrics["env/success"] == 0.0
    # Not solved: the env's own reward is absent, so the default is the sum of turn rewards.
    assert trajectory.episode_reward == pytest.approx(sum(trajectory.turn_rewards))


async def test_the_envs_own_limit_truncates_the_episode(processor: VLProcessor, envs: Envs) -> None:
    engine = ScriptedEngine(processor, wander)
    trajectory = await play(
        processor, engine, envs, config=config(max_turns=8), seed=5, options={"max_steps": 4}
    )
    assert (
        trajectory.status is Status.TRUNCATED and trajectory.error == "the env's own limit ended the episode"
    )
    assert len(trajectory.turn_rewards) < 8 and trajectory.metrics["env/steps"] == 4


async def test_a_length_finish_truncates_without_stepping_the_env(processor: VLProcessor, envs: Envs) -> None:
    engine = ScriptedEngine(processor, [TWO_MOVES], finish="length")
    trajectory = await play(processor, engine, envs, options=CORRIDOR)
    assert trajectory.status is Status.TRUNCATED
    assert trajectory.turn_rewards == [] and trajectory.episode_reward == 0.0
    assert trajectory.metrics["finish_length"] == 1
    generated = [t for t, m in zip(trajectory.train_ids, trajectory.loss_mask, strict=True) if m]
    assert generated == processor.tokenizer.encode(TWO_MOVES)


async def test_a_reply_longer_than_max_new_tokens_is_cut_and_truncated(
    processor: VLProcessor, envs: Envs
) -> None:
    engine = ScriptedEngine(processor, [TWO_MOVES])
    trajectory = await play(processor, engine, envs, config=config(max_new_tokens=4), options=CORRIDOR)
    assert trajectory.status is Status.TRUNCATED and "limit of 4 tokens" in (trajectory.error or "")
    assert sum(trajectory.loss_mask) == 4


async def test_the_generated_token_budget_clamps_and_then_ends_the_episode(
    processor: VLProcessor, envs: Envs
) -> None:
    reply_len = len(processor.tokenizer.encode(WANDER[0])) + 1
    budget = 2 * reply_len + 3
    engine = ScriptedEngine(processor, lambda index, request: WANDER[0])
    settings = config(max_new_tokens=reply_len + 1, rollout_max_response_len=budget, max_turns=8)
    trajectory = await play(processor, engine, envs, config=settings, seed=5)
    limits = [request.sampling.max_new_tokens for request in engine.requests]
    assert limits == [reply_len + 1, reply_len + 1, 3]
    assert trajectory.status is Status.TRUNCATED
    assert sum(trajectory.loss_mask) == budget == trajectory.metrics["generated_tokens"]
    assert len(trajectory.turn_rewards) == 2


async def test_a_spent_generated_token_budget_ends_after_the_step(processor: VLProcessor, envs: Envs) -> None:
    reply_len = len(processor.tokenizer.encode(WANDER[0])) + 1
    settings = config(max_new_tokens=reply_len, rollout_max_response_len=reply_len, max_turns=8)
    trajectory = await play(processor, ScriptedEngine(processor, wander), envs, config=settings, seed=5)
    assert trajectory.status is Status.TRUNCATED and "generated-token budget" in (trajectory.error or "")
    assert len(trajectory.turn_rewards) == 1
    assert trajectory.loss_mask[-1] == 1, "the trajectory ends on its last generation"


async def test_the_context_budget_ends_the_episode(processor: VLProcessor, envs: Envs) -> None:
    probe = await play(processor, ScriptedEngine(processor, wander), envs, config=config(max_turns=2), seed=5)
    first_turn = probe.turn_index.index(1)
    context = first_turn + 10  # the second observation does not fit
    settings = config(max_new_tokens=16, rollout_max_response_len=32, rollout_max_context_len=context)
    engine = ScriptedEngine(processor, wander)
    trajectory = await play(processor, engine, envs, config=settings, seed=5)
    assert trajectory.status is Status.TRUNCATED and "context budget" in (trajectory.error or "")
    assert len(engine.requests) == 1 and len(trajectory.turn_rewards) == 1


async def test_the_context_budget_clamps_max_new_tokens(processor: VLProcessor, envs: Envs) -> None:
    probe = await play(processor, ScriptedEngine(processor, wander), envs, config=config(max_turns=1), seed=5)
    prompt = probe.loss_mask.index(1)
    settings = config(max_new_tokens=16, rollout_max_response_len=32, rollout_max_context_len=prompt + 2)
    engine = ScriptedEngine(processor, wander)
    trajectory = await play(processor, engine, envs, config=settings, seed=5)
    assert engine.requests[0].sampling.max_new_tokens == 2
    assert trajectory.status is Status.TRUNCATED and len(trajectory.train_ids) == prompt + 2


@pytest.mark.parametrize(("served", "version"), [("5", 5), ("default", 0), ("0", 0), ("unknown", 3)])
async def test_the_episodes_policy_version_is_the_engines_and_its_starting_weights_are_version_0(
    processor: VLProcessor, envs: Envs, served: str, version: int
) -> None:
    """A restarted engine reports its starting weights as `default` (SGLang) or `0`: version 0, which lags
    a trainer past it; only an engine that reports nothing leaves the job's version."""
    engine = ScriptedEngine(processor, [TWO_MOVES, TWO_MOVES], weight_version=served)
    trajectory = await play(processor, engine, envs, options=CORRIDOR, policy_version=3)
    assert trajectory.policy_version == version


async def test_an_engine_abort_gives_aborted_with_the_reason(processor: VLProcessor, envs: Envs) -> None:
    trajectory = await play(
        processor, ScriptedEngine(processor, [TWO_MOVES], finish="abort"), envs, options=CORRIDOR
    )
    assert trajectory.status is Status.ABORTED and "scripted abort" in (trajectory.error or "")
    ran_out = await play(
        processor, ScriptedEngine(processor, [WANDER[0]]), envs, config=config(max_turns=3), seed=5
    )
    assert ran_out.status is Status.ABORTED and "no reply number 1" in (ran_out.error or "")
    assert sum(ran_out.loss_mask) == len(processor.tokenizer.encode(WANDER[0])) + 1


async def test_a_dead_engine_is_aborted_within_its_retry_deadline(processor: VLProcessor, envs: Envs) -> None:
    engine = SGLangEngine(f"http://127.0.0.1:{free_port()}", processor, retry_deadline_s=1.0)
    trajectory = await play(processor, engine, envs, options=CORRIDOR)
    await engine.close()
    assert trajectory.status is Status.ABORTED and "ClientConnectorError" in (trajectory.error or "")
    assert re.search(r"failed after \d+ attempt\(s\)", trajectory.error or "")  # the deadline ended them


async def test_a_dead_env_server_fails_the_episode_with_its_error(processor: VLProcessor, envs: Envs) -> None:
    with env_process("sokoban") as (url, proc):
        # The fresh server's first reset pays its one-off costs here, not inside the episode's 3 s bound.
        async with AsyncEnvClient(url, token="", timeout=60.0) as warm:
            await warm.close((await warm.reset(seed=5)).session_id)

        def kill_server_then_answer(index: int, request: GenerateRequest) -> str:
            if index == 1:
                proc.kill()
                proc.wait(timeout=10)
            return WANDER[index % len(WANDER)]

        engine = ScriptedEngine(processor, kill_server_then_answer)
        trajectory = await play(processor, engine, envs, url, config=config(max_turns=4), seed=5)
    assert trajectory.status is Status.FAILED and "step failed" in (trajectory.error or "")
    assert len(trajectory.turn_rewards) == 1


async def test_an_env_exception_fails_the_episode(processor: VLProcessor, envs: Envs) -> None:
    engine = ScriptedEngine(processor, ["inc", "boom"])
    trajectory = await play(
        processor, engine, envs, "tests.envs.counter", options={"fail_on": "boom", "target": 5}
    )
    assert trajectory.status is Status.FAILED and "told to fail" in (trajectory.error or "")
    assert trajectory.turn_rewards == [1.0]


async def test_the_episode_deadline_aborts_a_slow_episode(processor: VLProcessor, envs: Envs) -> None:
    handle = await envs.open("tests.envs.counter")
    engine = ScriptedEngine(processor, lambda index, request: "inc")
    slow = job("tests.envs.counter", config(), options={"step_delay_s": 0.5, "target": 100})
    trajectory = await run_episode(handle, engine, processor, slow, deadline_s=1.2)
    assert trajectory.status is Status.ABORTED and "deadline of 1.2 s" in (trajectory.error or "")
    assert 1 <= len(trajectory.turn_rewards) <= 3  # 0.5 s steps: the deadline, not the 100-step target


async def test_cancellation_propagates_and_closes_the_session(
    processor: VLProcessor, sokoban: tuple[str, Any], envs: Envs
) -> None:
    handle = await envs.open(sokoban[0])
    engine = ScriptedEngine(processor, wander)
    slow_step = handle.step

    async def step_forever(text: str) -> Any:
        await slow_step(text)
        await asyncio.sleep(3600)

    handle.step = step_forever  # type: ignore[method-assign]
    task = asyncio.create_task(run_episode(handle, engine, processor, job(sokoban[0], config(), seed=5)))
    while handle.session_id is None or not engine.requests:
        await asyncio.sleep(0.01)
    session_id = handle.session_id
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert handle.session_id is None
    assert await handle.sessions.close(session_id) is False, "the session was already deleted"


def test_bad_job_settings_are_refused_naming_the_field() -> None:
    with pytest.raises(ValidationError, match="settings\n  Field required"):
        EpisodeJob(episode_id="e1", group_id="g1", env="sokoban")  # a worker's own config plays no job
    settings = EpisodeSettings.of(config()).model_dump()
    with pytest.raises(ValidationError, match="max_tokens"):
        job(settings={**settings, "sampling": {**settings["sampling"], "max_tokens": 5}})
    with pytest.raises(ValidationError, match="max_new_tokens"):
        job(settings={**settings, "sampling": {**settings["sampling"], "max_new_tokens": 5000}})
    with pytest.raises(ValidationError, match="temperature"):
        EpisodeSettings.of(config()).sampled_with(temperature=-1.0)


async def test_a_failing_reward_function_fails_the_episode(processor: VLProcessor, envs: Envs) -> None:
    def broken(turn_rewards: Any, info: Any) -> float:
        raise KeyError("metrics")

    engine = ScriptedEngine(processor, [TWO_MOVES, TWO_MOVES])
    handle = await envs.open("sokoban")
    trajectory = await run_episode(handle, engine, processor, job(options=CORRIDOR), reward_fn=broken)
    assert trajectory.status is Status.FAILED and "reward function failed" in (trajectory.error or "")


def test_episode_settings_are_the_rollout_sections_own() -> None:
    rollout = config(max_turns=3, rollout_temperature=0.8, rollout_top_p=0.9, top_k=20, stop=["</answer>"])
    settings = EpisodeSettings.of(rollout)
    assert (settings.max_turns, settings.rollout_max_response_len, settings.rollout_max_context_len) == (
        3,
        256,
        rollout.rollout_max_context_len,
    )
    params = settings.sampling
    assert (params.max_new_tokens, params.temperature, params.top_p, params.top_k) == (64, 0.8, 0.9, 20)
    assert params.stop == ["</answer>"] and params.sampling_seed is None


async def test_a_job_is_played_as_its_settings_and_seed_say_and_its_trajectory_carries_them(
    processor: VLProcessor, envs: Envs
) -> None:
    engine = ScriptedEngine(processor, wander)
    rollout = config(max_turns=2, rollout_temperature=0.5, rollout_top_p=0.9, max_staleness=2)
    settings = EpisodeSettings.of(rollout)
    trajectory = await play(processor, engine, envs, seed=5, settings=settings, sampling_seed=9)
    assert trajectory.status is Status.TRUNCATED and "turn budget of 2 turns" in (trajectory.error or "")
    assert [(r.sampling.temperature, r.sampling.sampling_seed) for r in engine.requests] == [(0.5, 9)] * 2
    assert trajectory.behaviour == Behaviour(temperature=0.5, top_p=0.9, top_k=-1, min_p=0.0, max_staleness=2)
    failed = await RolloutRunner(engine, processor, envs=envs)(job("no.such.env", settings=settings))
    assert failed.status is Status.FAILED and failed.behaviour == trajectory.behaviour


async def test_images_reach_the_engine_and_the_trajectory_in_order(
    processor: VLProcessor, sokoban: tuple[str, Any], envs: Envs
) -> None:
    engine = ScriptedEngine(processor, wander)
    trajectory = await play(processor, engine, envs, sokoban[0], config=config(max_turns=4), seed=11)
    replay = await envs.open("sokoban")
    first, _ = await replay.reset(job("sokoban", seed=11))
    observed = image_urls(first)
    for index in range(3):
        message, *_ = await replay.step(WANDER[index])
        observed += image_urls(message)
    await replay.close()
    assert trajectory.images == observed and len(set(observed)) > 1
    for k, request in enumerate(engine.requests):
        assert request.images == observed[: k + 1]
        assert request.engine_ids == trajectory.engine_ids[: len(request.engine_ids)]
    assert trajectory.image_grid_thw == [processor.image_grid(url) for url in observed]
    runs = pad_runs(trajectory.train_ids, processor.ids.image_pad)
    assert runs == [processor.num_image_tokens(grid) for grid in trajectory.image_grid_thw]
    assert pad_runs(trajectory.engine_ids, processor.ids.image_pad) == [1] * len(observed)


def pad_runs(ids: list[int], pad: int) -> list[int]:
    """Lengths of the maximal runs of `pad` in `ids`, in order."""
    runs: list[int] = []
    previous = None
    for token in ids:
        if token == pad:
            if previous == pad:
                runs[-1] += 1
            else:
                runs.append(1)
        previous = token
    return runs


async def test_local_module_and_remote_server_give_the_same_trajectory(
    processor: VLProcessor, sokoban: tuple[str, Any], envs: Envs
) -> None:
    played = []
    for env in ("vistarl.services.sokoban", sokoban[0]):
        engine = ScriptedEngine(processor, wander)
        played.append(
            (await play(processor, engine, envs, env, config=config(max_turns=3), seed=3)).to_dict()
        )
    local, remote = played
    for trajectory in played:
        trajectory.pop("timings")
        trajectory.pop("env")
    assert local == remote


def test_groups_share_a_start_and_differ_in_sampling_seed() -> None:
    settings = EpisodeSettings.of(config(rollout_top_p=0.9))
    starts = [{"seed": 1}, {"seed": 2, "options": {"grid_size": 7}}]
    jobs = group_jobs("sokoban", starts, 3, settings=settings)
    assert [j.group_id for j in jobs] == ["ep-g0"] * 3 + ["ep-g1"] * 3
    assert len({j.episode_id for j in jobs}) == 6
    assert [j.seed for j in jobs] == [1, 1, 1, 2, 2, 2] and jobs[3].options == {"grid_size": 7}
    seeds = [j.sampling_seed for j in jobs]
    assert len(set(seeds)) == 6 and all(j.settings == settings for j in jobs)
    again = group_jobs("sokoban", [{"seed": 1}, {"seed": 2}], 3, settings=EpisodeSettings.of(config()))
    assert [j.sampling_seed for j in again] == seeds
    with pytest.raises(ValueError, match=r"takes options, sample, seed, task_id; got \[.sed.\]"):
        group_jobs("sokoban", [{"sed": 1}], 2, settings=settings)


async def test_run_jobs_bounds_concurrency_and_yields_every_result() -> None:
    running = most = 0

    async def runner(episode: EpisodeJob) -> Trajectory:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.01)
        running -= 1
        return trajectory_for(episode)

    jobs = group_jobs("sokoban", [{"seed": s} for s in range(5)], 2, settings=EpisodeSettings.of(config()))
    results = [result async for result in run_jobs(runner, jobs, 3)]
    assert sorted(r.episode_id for r in results) == sorted(j.episode_id for j in jobs)
    assert most == 3
