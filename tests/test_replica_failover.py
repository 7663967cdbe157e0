"""A replica SIGKILLed mid-episode loses nothing: the client goes on on another replica, and no step is
applied twice (docs/server.md, "Session store"; docs/client.md, "Several replicas").

Two real `vistarl serve` processes share one private redis-server (`--session-store`): `a` runs envs in
threads, `b` in an env worker process. A client given both URLs plays; `a`, where the episode started,
is killed with SIGKILL, and the session's next calls reach `b`, which restores the env from Redis.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import httpx

from tests.envs.serving import counter_process, counter_server, served, served_process
from tests.servers import metric
from vistarl.clients import AsyncEnvClient, EnvClient, RetryPolicy
from vistarl.clients.protocol import StepResponse
from vistarl.services.env_api import load_env_factory
from vistarl.services.server.encoding import json_safe

RETRY = RetryPolicy(max_attempts=5, base_delay=0.1, max_delay=0.5, deadline_s=30.0)
SOKOBAN_OPTIONS = {"max_steps": 16}
SEED = 7
KILL_AT = 3  # the turn whose answer is lost with `a`
MOVES = ("Up", "Down", "Left", "Right")


def test_a_sokoban_episode_goes_on_after_its_replica_is_killed(redis_url: str) -> None:
    """Every answer, and the episode's reward at the end, match the same episode played uninterrupted in
    process; the step whose answer died with `a` is replayed from the store, not applied again."""
    factory = load_env_factory("sokoban")
    reference = factory.create(factory.options_model.model_validate(SOKOBAN_OPTIONS), SEED, None)
    first_obs, _ = reference.reset()
    rng = random.Random(SEED)
    store = ("--session-store", redis_url)
    with (
        served_process("sokoban", *store) as (a, a_proc),
        served("sokoban", *store, "--env-workers", "1") as b,
        EnvClient([a, b], token="", retry=RETRY) as client,
    ):
        start = client.reset(seed=SEED, options=SOKOBAN_OPTIONS)
        assert start.observation.text == first_obs["text"]
        turns, done = 0, False
        while not done:
            action = f"<answer>{rng.choice(MOVES)}</answer>"
            if turns == KILL_AT:
                body = {"session_id": start.session_id, "action": action, "request_id": "lost"}
                lost = httpx.post(f"{a}/step", json=body, timeout=30)  # stored; its answer is then lost
                a_proc.kill()
                a_proc.wait()
                answer = client.step(start.session_id, action, request_id="lost")  # a refuses: b replays
                assert answer == StepResponse.model_validate_json(lost.content)
            else:
                answer = client.step(start.session_id, action)
            expected = reference.step(action)
            done, info = expected.done, expected.info
            assert (answer.observation.text, answer.reward, answer.done, answer.truncated, answer.info) == (
                expected.observation["text"],
                expected.reward,
                done,
                expected.truncated,
                json_safe(info),
            ), f"turn {turns}"
            turns += 1
        assert answer.info["episode_reward"] == info["episode_reward"]
        assert turns > KILL_AT + 1
        assert metric(b, "vistarl_env_restored_sessions_total") == 1
        assert metric(b, "vistarl_env_steps_total") == turns - KILL_AT - 1  # the replayed step is not one


async def test_a_step_cut_off_by_the_kill_is_applied_once_on_the_other_replica(
    redis_url: str, tmp_path: Path
) -> None:
    """`a` dies in the middle of a step: the client's connection drops, and its retry (same request_id)
    reaches `b`, which steps from the last stored state, so the step counts once."""
    marker = tmp_path / "stepping"
    options = {"target": 10, "step_delay_s": 0.5, "step_marker": str(marker)}
    store = ("--session-store", redis_url)
    with counter_process(*store) as (a, a_proc), counter_server(*store) as b:
        async with AsyncEnvClient([a, b], token="", retry=RETRY) as client:
            session = (await client.reset(options=options)).session_id
            assert (await client.step(session, "inc")).observation.text.startswith("count=1 steps=1")
            marker.unlink()
            cut_off = asyncio.create_task(client.step(session, "inc", request_id="cut-off"))
            async with asyncio.timeout(10):
                while not marker.exists():  # a is in the middle of the step
                    await asyncio.sleep(0.01)
            a_proc.kill()
            answer = await asyncio.wait_for(cut_off, timeout=30)
            assert answer.observation.text.startswith("count=2 steps=2")
            assert (await client.step(session, "inc")).observation.text.startswith("count=3 steps=3")
        assert metric(b, "vistarl_env_steps_total") == 2
