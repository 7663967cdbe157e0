"""OpenEnv's WebSocket session protocol on a real `vistarl serve`: openenv-core's own `GenericEnvClient`
plays Sokoban and Geo3k to the end over `/ws` with the rewards `/reset` and `/step` give for the same
actions, and every answer, `/schema` and `/metadata` parse as openenv-core's own models. One socket is one
vistarl session: the server's limits, token and session store apply, and with a shared store the session
goes on through another replica after its own is killed (docs/agents.md, "OpenEnv and TRL")."""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openenv.core.env_server.mcp_types import WSMCPResponse
from openenv.core.env_server.types import (
    EnvironmentMetadata,
    SchemaResponse,
    WSErrorResponse,
    WSObservationResponse,
    WSStateResponse,
)
from openenv.core.generic_client import GenericEnvClient
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, ConnectionClosedOK, InvalidStatus

from tests.envs.serving import served, served_process
from tests.servers import metric
from vistarl.clients.http import EnvClient
from vistarl.clients.protocol import OPENENV_CORE_VERSION
from vistarl.services.geo3k.generator import generate
from vistarl.services.sokoban.game import Level
from vistarl.services.sokoban.solver import solve

SOKOBAN_OPTIONS = {"max_steps": 12, "max_actions_per_turn": 1}
MOVES = ("Up", "Down", "Left", "Right")


@pytest.fixture(scope="module")
def sokoban() -> Iterator[str]:
    with served("sokoban", "--env-workers", "1") as url:
        yield url


@pytest.fixture(scope="module")
def geo3k() -> Iterator[str]:
    with served("geo3k", "--env-workers", "0") as url:
        yield url


def ws_url(url: str, path: str = "/ws") -> str:
    return url.replace("http://", "ws://") + path


async def ask(socket: ClientConnection, message: dict[str, Any]) -> dict[str, Any]:
    """Send one message and read its answer, raw."""
    await socket.send(json.dumps(message))
    answer: dict[str, Any] = json.loads(await socket.recv(decode=True))
    return answer


def http_rewards(url: str, reset: dict[str, Any], actions: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """(reward, done, truncated, info) of each step of the same episode played over `/reset` and `/step`."""
    with EnvClient(url, token="") as client:
        start = client.reset(**reset)
        turns = []
        for action in actions:
            body = {"session_id": start.session_id, **action}
            answer = httpx.post(f"{url}/step", json=body, timeout=60).raise_for_status().json()
            turns.append((answer["reward"], answer["done"], answer["truncated"], answer["info"]))
        client.close(start.session_id)
    return turns


async def test_generic_env_client_solves_sokoban_with_the_http_rewards(sokoban: str) -> None:
    async with GenericEnvClient(base_url=sokoban) as env:
        first = await env.reset(seed=9, episode_id="solve-9")
        assert (first.reward, first.done) == (None, False)
        assert first.observation["text"].startswith("[Observation]")
        assert first.observation["images"][0].startswith("data:image/png;base64,")
        moves = solve(Level.from_xsb(first.observation["info"]["level"])).moves
        assert moves is not None
        actions = [
            {"action": f"<answer>{', '.join(moves[at : at + 3])}</answer>"} for at in range(0, len(moves), 3)
        ]
        turns = []
        for action in actions:
            result = await env.step(action)
            turns.append(
                (result.reward, result.done, result.observation["truncated"], result.observation["info"])
            )
        assert (await env.state()) == {"episode_id": "solve-9", "step_count": len(actions), "done": True}
    assert turns[-1][1] and turns[-1][3]["success"] and not any(done for _, done, _, _ in turns[:-1])
    assert turns == http_rewards(sokoban, {"seed": 9}, actions)


async def test_an_episode_cut_by_the_step_cap_is_truncated_as_over_http(sokoban: str) -> None:
    rng = random.Random(3)
    actions = [
        {"action": f"<answer>{rng.choice(MOVES)}</answer>"} for _ in range(SOKOBAN_OPTIONS["max_steps"])
    ]
    async with GenericEnvClient(base_url=sokoban) as env:
        await env.reset(seed=3, options=SOKOBAN_OPTIONS)
        turns = []
        for action in actions:
            result = await env.step(action)
            turns.append(
                (result.reward, result.done, result.observation["truncated"], result.observation["info"])
            )
            if result.done:
                break
    assert turns == http_rewards(sokoban, {"seed": 3, "options": SOKOBAN_OPTIONS}, actions[: len(turns)])
    assert turns[-1][1] and turns[-1][2]  # the cap, not a solve, ended it


async def test_generic_env_client_plays_geo3k_to_its_final_answer_with_tool_calls(geo3k: str) -> None:
    answer = generate(31).answer
    actions: list[dict[str, Any]] = [
        {"tool_call": {"name": "calc_score", "arguments": {"answer": f"{answer} + 1"}}},
        {"tool_call": {"name": "calc_score", "arguments": json.dumps({"answer": answer})}},
        {"action": f"Answer: \\boxed{{{answer}}}"},
    ]
    async with GenericEnvClient(base_url=geo3k, message_timeout_s=120) as env:
        first = await env.reset(seed=31, format=True)
        assert len(first.observation["images"]) == 1 and first.observation["message"]["role"] == "user"
        turns = []
        for action in actions:
            result = await env.step(action)
            turns.append(
                (result.reward, result.done, result.observation["truncated"], result.observation["info"])
            )
    assert [info["outcome"] for *_, info in turns[:2]] == ["wrong", "correct"]
    assert turns[-1][:2] == (1.0, True) and turns[-1][3]["episode_reward"] == 1.0
    assert turns == http_rewards(geo3k, {"seed": 31}, actions)


def test_the_openenv_script_of_the_docs_plays_an_episode(sokoban: str, tmp_path: Path) -> None:
    doc = (Path(__file__).parents[1] / "docs" / "agents.md").read_text()
    blocks = [block.split("```", 1)[0] for block in doc.split("```python\n")[1:]]
    script = tmp_path / "openenv_play.py"
    script.write_text(next(block for block in blocks if "GenericEnvClient" in block))
    run = subprocess.run(
        [sys.executable, str(script), sokoban, "--seed", "3", "--turns", "4"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.count("turn: reward") == 4 and "episode reward" in run.stdout
    assert httpx.get(f"{sokoban}/ready").json()["active_sessions"] == 0


async def test_every_answer_parses_as_openenv_cores_own_models(sokoban: str) -> None:
    assert importlib.metadata.version("openenv-core") == OPENENV_CORE_VERSION  # the release checked here
    async with connect(ws_url(sokoban)) as socket:
        observation = WSObservationResponse.model_validate(
            await ask(socket, {"type": "reset", "data": {"seed": 1}})
        )
        assert set(observation.data) == {"observation", "reward", "done"}
        step = await ask(socket, {"type": "step", "data": {"action": "<answer>Left</answer>"}})
        assert WSObservationResponse.model_validate(step).data["reward"] == pytest.approx(
            step["data"]["reward"]
        )
        state = WSStateResponse.model_validate(await ask(socket, {"type": "state"}))
        assert state.data["step_count"] == 1
        error = WSErrorResponse.model_validate(await ask(socket, {"type": "step", "data": {"move": "Up"}}))
        assert error.data["code"] == "VALIDATION_ERROR" and "data.move" in error.data["message"]
    schema = SchemaResponse.model_validate(httpx.get(f"{sokoban}/schema").raise_for_status().json())
    assert {"action", "tool_call"} <= set(schema.action["properties"])
    assert {"text", "images", "done", "reward", "truncated"} <= set(schema.observation["properties"])
    assert {"episode_id", "step_count"} <= set(schema.state["properties"])
    metadata = EnvironmentMetadata.model_validate(httpx.get(f"{sokoban}/metadata").raise_for_status().json())
    assert metadata.name == "sokoban" and metadata.readme_content and "Up" in metadata.readme_content


@pytest.mark.parametrize(
    ("message", "code", "error_code"),
    [
        ("{not json", "INVALID_JSON", "bad_request"),
        ({"type": "render"}, "UNKNOWN_TYPE", "bad_request"),
        ({"kind": "reset"}, "VALIDATION_ERROR", "validation_error"),
        ({"type": "step", "data": {"action": "<answer>Up</answer>"}}, "SESSION_ERROR", "session_not_found"),
        ({"type": "reset", "data": {"seed": 1, "session_id": "x"}}, "VALIDATION_ERROR", "validation_error"),
        ({"type": "reset", "data": {"options": {"num_boxes": 9}}}, "VALIDATION_ERROR", "invalid_options"),
    ],
)
async def test_a_bad_message_is_an_error_answer_and_the_socket_stays_open(
    sokoban: str, message: Any, code: str, error_code: str
) -> None:
    async with connect(ws_url(sokoban)) as socket:
        await socket.send(message if isinstance(message, str) else json.dumps(message))
        error = json.loads(await socket.recv(decode=True))
        assert error["type"] == "error" and error["data"]["code"] == code
        assert error["data"]["error_code"] == error_code
        assert (await ask(socket, {"type": "reset", "data": {"seed": 2}}))["type"] == "observation"


def rpc(method: str, request_id: int, **params: Any) -> dict[str, Any]:
    """An `mcp` message: a JSON-RPC request."""
    return {"type": "mcp", "data": {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}}


async def test_the_mcp_message_lists_the_envs_tools_and_calls_them_on_the_sockets_session(
    sokoban: str,
) -> None:
    """OpenEnv's `mcp` message type: JSON-RPC on the socket's session; every failure a JSON-RPC error."""
    act = {"name": "act", "arguments": {"moves": ["Left", "Up"]}}
    async with connect(ws_url(sokoban)) as socket:
        listing = WSMCPResponse.model_validate(await ask(socket, rpc("tools/list", 1)))
        assert listing.type == "mcp" and listing.data["id"] == 1
        (tool,) = listing.data["result"]["tools"]
        assert tool["name"] == "act" and tool["inputSchema"]["required"] == ["moves"]
        early = (await ask(socket, rpc("tools/call", 2, **act)))["data"]
        assert (
            early["error"]["code"] == -32000 and early["error"]["data"]["error_code"] == "session_not_found"
        )
        await ask(socket, {"type": "reset", "data": {"seed": 7, "options": SOKOBAN_OPTIONS}})
        called = (await ask(socket, rpc("tools/call", 3, **act)))["data"]
        assert called["id"] == 3 and "error" not in called
        assert (await ask(socket, {"type": "state"}))["data"]["step_count"] == 1
        failures = [
            (rpc("tools/call", 4, name="jump"), -32602, "validation_error", "no tool 'jump'"),
            (
                rpc("tools/call", 5, name="act", arguments={"moves": ["Sideways"]}),
                -32602,
                "validation_error",
                "",
            ),
            (rpc("resources/list", 6), -32601, "bad_request", "tools/list and tools/call"),
            ({"type": "mcp", "data": {"method": "tools/list"}}, -32600, "validation_error", "data.jsonrpc"),
        ]
        for message, code, error_code, words in failures:
            answer = await ask(socket, message)
            assert answer["type"] == "mcp" and answer["data"]["error"]["code"] == code, answer
            assert answer["data"]["error"]["data"]["error_code"] == error_code and words in str(answer)
        assert (await ask(socket, {"type": "state"}))["data"]["step_count"] == 1  # nothing else stepped
    observation = called["result"]
    turn = (observation["reward"], observation["done"], observation["observation"]["truncated"])
    over_http = http_rewards(sokoban, {"seed": 7, "options": SOKOBAN_OPTIONS}, [{"tool_call": act}])
    assert [(*turn, observation["observation"]["info"])] == over_http


async def test_generic_env_client_continues_a_lost_sockets_session_at_its_sessions_path(sokoban: str) -> None:
    """OpenEnv's client appends `/ws` to its base URL, so `/sessions/ID` as the base reaches the session."""
    async with connect(ws_url(sokoban)) as lost:
        await ask(lost, {"type": "reset", "data": {"seed": 3, "episode_id": "lost-3"}})
        await ask(lost, {"type": "step", "data": {"action": "<answer>Up</answer>"}})
        lost.transport.abort()  # no close frame: the session stays for its TTL
    async with GenericEnvClient(base_url=f"{sokoban}/sessions/lost-3") as env:
        assert await env.state() == {"episode_id": "lost-3", "step_count": 1, "done": False}
        await env.step({"action": "<answer>Down</answer>"})
        assert (await env.state())["step_count"] == 2
    with pytest.raises(ConnectionError, match="HTTP 404"):  # the client's close ended the session
        await GenericEnvClient(base_url=f"{sokoban}/sessions/lost-3").connect()


async def test_a_step_after_the_end_is_episode_done_and_a_reset_starts_afresh(sokoban: str) -> None:
    async with GenericEnvClient(base_url=sokoban) as env:
        await env.reset(seed=5, options={"max_steps": 1})
        assert (await env.step({"action": "<answer>Up</answer>"})).done
        with pytest.raises(RuntimeError, match=r"episode of session \w+ is done"):
            await env.step({"action": "<answer>Up</answer>"})
        again = await env.reset(seed=5)
        assert not again.done and (await env.state())["step_count"] == 0


async def test_a_socket_session_is_a_vistarl_session_that_ends_with_the_socket(sokoban: str) -> None:
    async with GenericEnvClient(base_url=sokoban) as env:
        await env.reset(seed=4, episode_id="shared-4")
        body = {"session_id": "shared-4", "action": "<answer>Down</answer>"}
        assert httpx.post(f"{sokoban}/step", json=body).status_code == 200  # the same session over HTTP
        assert (await env.state())["step_count"] == 1
    assert httpx.post(f"{sokoban}/step", json=body).status_code == 404  # the socket's close ended it


async def test_a_dropped_connection_leaves_the_session_to_a_new_socket(sokoban: str) -> None:
    """A connection lost without a close frame keeps its session: `/ws?session_id=` goes on from its last
    step, and that socket's `close` ends it."""
    rng = random.Random(7)
    actions = [{"action": f"<answer>{rng.choice(MOVES)}</answer>"} for _ in range(4)]
    reset = {"seed": 7, "options": SOKOBAN_OPTIONS, "episode_id": "dropped-7"}
    async with connect(ws_url(sokoban)) as socket:
        await ask(socket, {"type": "reset", "data": reset})
        turns = [(await ask(socket, {"type": "step", "data": action}))["data"] for action in actions[:2]]
        socket.transport.abort()  # the connection is lost: no close frame
    async with connect(ws_url(sokoban, "/ws?session_id=dropped-7")) as socket:
        assert (await ask(socket, {"type": "state"}))["data"] == {
            "episode_id": "dropped-7",
            "step_count": 2,
            "done": False,
        }
        for action in actions[2:]:
            answer = await ask(socket, {"type": "step", "data": action})
            assert answer["type"] == "observation", answer
            turns.append(answer["data"])
        await socket.send(json.dumps({"type": "close"}))
        with pytest.raises(ConnectionClosedOK):
            await socket.recv()
    played = [(t["reward"], t["done"], t["observation"]["info"]) for t in turns]
    over_http = http_rewards(sokoban, {"seed": 7, "options": SOKOBAN_OPTIONS}, actions)
    assert played == [(reward, done, info) for reward, done, _, info in over_http]
    with pytest.raises(InvalidStatus, match="HTTP 404"):
        async with connect(ws_url(sokoban, "/ws?session_id=dropped-7")):
            pass


async def test_the_servers_session_body_and_idle_limits_apply_to_sockets() -> None:
    limits = ("--max-sessions", "1", "--max-body-bytes", "2048", "--session-ttl", "2")
    with served("sokoban", *limits, "--env-workers", "0") as url:
        async with GenericEnvClient(base_url=url) as first, connect(ws_url(url)) as second:
            await first.reset(seed=1)
            refused = await ask(second, {"type": "reset", "data": {"seed": 2}})
            assert (
                refused["data"]["code"] == "CAPACITY_REACHED"
                and refused["data"]["error_code"] == "at_capacity"
            )
            await first.close()
            assert (await ask(second, {"type": "reset", "data": {"seed": 2}}))["type"] == "observation"
            with pytest.raises(ConnectionClosed) as closed:
                await ask(second, {"type": "step", "data": {"action": "x" * 4096}})
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
        async with connect(ws_url(url)) as idle:
            with pytest.raises(ConnectionClosedOK):  # nothing sent for the session TTL: the server closes it
                async with asyncio.timeout(60):
                    await idle.recv()


async def test_the_bearer_token_guards_the_handshake_and_rides_in_the_url_for_openenvs_client() -> None:
    with served("sokoban", "--env-workers", "0", env={"VISTARL_API_TOKEN": "sesame"}) as url:
        with pytest.raises(ConnectionError, match="HTTP 401"):
            await GenericEnvClient(base_url=url).connect()
        with pytest.raises(ConnectionError, match="HTTP 401"):
            await GenericEnvClient(base_url=url.replace("//", "//agent:wrong@")).connect()
        async with GenericEnvClient(base_url=url.replace("//", "//agent:sesame@")) as env:
            assert not (await env.reset(seed=1)).done
        async with connect(ws_url(url), additional_headers={"Authorization": "Bearer sesame"}) as socket:
            assert (await ask(socket, {"type": "reset", "data": {"seed": 1}}))["type"] == "observation"
        assert httpx.get(f"{url}/state").status_code == 401
        assert httpx.get(f"{url}/schema").status_code == httpx.get(f"{url}/metadata").status_code == 200
        with pytest.raises(ConnectionError, match="HTTP 401"):
            await GenericEnvClient(base_url=f"{url}/sessions/any").connect()
        assert metric(url, 'vistarl_env_errors_total{code="unauthorized"}') == 4


async def test_a_socket_session_goes_on_through_another_replica_after_its_own_is_killed(
    redis_url: str,
) -> None:
    rng = random.Random(11)
    actions = [
        {"action": f"<answer>{rng.choice(MOVES)}</answer>"} for _ in range(SOKOBAN_OPTIONS["max_steps"])
    ]
    store = ("--session-store", redis_url)
    reset = {"seed": 11, "options": SOKOBAN_OPTIONS, "episode_id": "replica-11"}
    with (
        served_process("sokoban", *store, "--env-workers", "0") as (a, a_proc),
        served("sokoban", *store) as b,
    ):
        turns = []
        async with connect(ws_url(a)) as socket:
            await ask(socket, {"type": "reset", "data": reset})
            for action in actions[:3]:
                turns.append((await ask(socket, {"type": "step", "data": action}))["data"])
            a_proc.kill()
            a_proc.wait()
        async with connect(ws_url(b, "/ws?session_id=replica-11")) as socket:
            assert (await ask(socket, {"type": "state"}))["data"]["step_count"] == 3
            for action in actions[3:]:
                turns.append((await ask(socket, {"type": "step", "data": action}))["data"])
                if turns[-1]["done"]:
                    break
        with pytest.raises(InvalidStatus, match="HTTP 404"):
            async with connect(ws_url(b, "/ws?session_id=replica-11")):
                pass  # the episode ended, and its socket's close ended the session
        played = [
            (t["reward"], t["done"], t["observation"]["truncated"], t["observation"]["info"]) for t in turns
        ]
        assert played[-1][1] and metric(b, "vistarl_env_restored_sessions_total") == 1
        assert played == http_rewards(b, {"seed": 11, "options": SOKOBAN_OPTIONS}, actions[: len(played)])
