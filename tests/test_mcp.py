"""MCP with the SDK's own clients: `/mcp` of a real `vistarl serve sokoban` with a token (streamable HTTP),
and `vistarl mcp sokoban` (stdio). Episodes are played to the end with moves from the Sokoban solver."""

from __future__ import annotations

import base64
import io
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client, types
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from PIL import Image

from tests.envs.serving import served
from tests.wire import assert_error
from vistarl.services.server.mcp_route import UNAUTHENTICATED_BODY_BYTES
from vistarl.services.sokoban.game import Level
from vistarl.services.sokoban.prompt import ACTION_FORMAT
from vistarl.services.sokoban.solver import solve

TOKEN = "mcp-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TOOLS = {"start_episode", "act", "observe", "end_episode"}
# The player pushes the box three cells right onto the target: four moves.
CORRIDOR = "########\n#@ $  .#\n########"


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with served("sokoban", "--max-sessions", "4", env={"VISTARL_API_TOKEN": TOKEN}) as base:
        yield base


@asynccontextmanager
async def http_client(url: str, headers: dict[str, str] | None = None) -> AsyncIterator[Client]:
    """The SDK's client on the server's `/mcp`, sending `headers` (the bearer token by default)."""
    transport = streamable_http_client(
        f"{url}/mcp", http_client=httpx2.AsyncClient(headers=AUTH if headers is None else headers)
    )
    async with Client(transport) as client:
        yield client


def text(result: types.CallToolResult) -> str:
    """The first text block of a result."""
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


async def call(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    """A successful call's structured content."""
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, text(result)
    assert isinstance(result.structured_content, dict)
    return result.structured_content


async def play_to_the_end(client: Client, start: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """Start an episode, solve its level and act three moves a turn until done; the session and turns."""
    first = await client.call_tool("start_episode", start)
    assert not first.is_error, text(first)
    opening = first.structured_content
    assert isinstance(opening, dict)
    moves = solve(Level.from_xsb(opening["info"]["level"])).moves
    assert moves, "the solver found no solution"
    turns = []
    for at in range(0, len(moves), 3):
        answer = ", ".join(moves[at : at + 3])
        turns.append(
            await call(client, "act", session_id=opening["session_id"], action=f"<answer>{answer}</answer>")
        )
    return opening["session_id"], turns


def metric(url: str, name: str) -> float:
    """One sample of the server's Prometheus text (0 when absent)."""
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    return 0.0


async def test_the_tools_are_listed_with_their_schemas(url: str) -> None:
    async with http_client(url) as client:
        listed = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert set(listed) == TOOLS
    assert ACTION_FORMAT in (listed["act"].description or "")
    assert listed["act"].input_schema["required"] == ["session_id", "action"]
    assert set(listed["start_episode"].input_schema["properties"]) == {"seed", "task_id", "sample", "options"}
    assert (
        listed["observe"].output_schema is not None
        and "reward" in listed["observe"].output_schema["properties"]
    )


async def test_a_sokoban_episode_plays_to_the_end_over_http(url: str) -> None:
    resets, steps = metric(url, "vistarl_env_resets_total"), metric(url, "vistarl_env_steps_total")
    async with http_client(url) as client:
        first = await client.call_tool("start_episode", {"seed": 11, "options": {"render_mode": "both"}})
        image = first.content[1]
        assert isinstance(image, types.ImageContent) and image.mime_type == "image/png"
        assert Image.open(io.BytesIO(base64.b64decode(image.data))).size == (384, 384)
        assert "[Observation]" in text(first) and "#" in text(first)  # the text grid of render_mode both
        assert isinstance(first.structured_content, dict)
        await client.call_tool("end_episode", {"session_id": first.structured_content["session_id"]})
        session, turns = await play_to_the_end(client, {"seed": 11})
        last = turns[-1]
        assert last["done"] and not last["truncated"] and last["info"]["success"] is True
        assert [turn["done"] for turn in turns[:-1]] == [False] * (len(turns) - 1)
        assert last["info"]["episode_reward"] > 5  # solved: +5 on top of the mean turn reward
        again = await call(client, "observe", session_id=session)
        assert again == last
        assert (
            text(await client.call_tool("end_episode", {"session_id": session})) == f"session {session} ended"
        )
    assert metric(url, "vistarl_env_resets_total") == resets + 2
    assert metric(url, "vistarl_env_steps_total") == steps + len(turns)


async def test_an_mcp_episode_is_a_session_of_the_http_api(url: str) -> None:
    async with http_client(url) as client:
        opening = await call(client, "start_episode", options={"xsb": CORRIDOR})
        session = opening["session_id"]
        ready = httpx.get(f"{url}/ready").json()
        assert ready["active_sessions"] >= 1
        step = {"session_id": session, "action": "<answer>Right</answer>"}
        by_http = httpx.post(f"{url}/step", json=step, headers=AUTH).json()
        seen = await client.call_tool("observe", {"session_id": session})
        assert seen.structured_content == {
            "session_id": session,
            "reward": by_http["reward"],
            "done": False,
            "truncated": False,
            "info": by_http["info"],
        }
        assert text(seen).endswith(by_http["observation"]["text"])
        assert httpx.delete(f"{url}/sessions/{session}", headers=AUTH).status_code == 204
        gone = await client.call_tool("act", {"session_id": session, "action": "<answer>Right</answer>"})
    assert gone.is_error and text(gone).startswith("session_not_found:")


@pytest.mark.parametrize(
    ("tool", "arguments", "expected"),
    [
        ("act", {"session_id": "s"}, "validation_error: action: Field required"),
        ("act", {"session_id": "s", "action": "up", "extra": 1}, "validation_error: extra: Extra inputs"),
        ("start_episode", {"seed": "eleven"}, "validation_error: seed: Input should be a valid integer"),
        ("start_episode", {"seed": 1, "task_id": "test/0"}, "give at most one of seed, task_id and sample"),
        ("start_episode", {"options": {"grid_size": 99}}, "invalid_options: options.grid_size"),
        ("start_episode", {"task_id": "test/0"}, "task_not_found:"),
        ("observe", {"session_id": "nobody"}, "session_not_found: unknown or expired session nobody"),
        ("end_episode", {}, "validation_error: session_id: Field required"),
    ],
)
async def test_bad_arguments_are_tool_errors(
    url: str, tool: str, arguments: dict[str, Any], expected: str
) -> None:
    async with http_client(url) as client:
        result = await client.call_tool(tool, arguments)
    assert result.is_error
    assert expected in text(result)


async def test_mcp_episodes_count_against_the_servers_capacity(url: str) -> None:
    free = httpx.get(f"{url}/ready").json()
    async with http_client(url) as client:
        started = [
            (await call(client, "start_episode", seed=n))["session_id"]
            for n in range(free["max_sessions"] - free["active_sessions"])
        ]
        assert httpx.post(f"{url}/reset", json={}, headers=AUTH).status_code == 503
        full = await client.call_tool("start_episode", {"seed": 0})
        assert full.is_error and text(full).startswith("at_capacity:")
        for session in started:
            await client.call_tool("end_episode", {"session_id": session})
    assert httpx.get(f"{url}/ready").json()["active_sessions"] == free["active_sessions"]


def test_mcp_and_the_pages_are_not_in_the_openapi_schema(url: str) -> None:
    paths = httpx.get(f"{url}/openapi.json", headers=AUTH).json()["paths"]
    assert "/step" in paths and not [path for path in paths if path.startswith(("/mcp", "/play"))]


async def test_an_unknown_tool_is_a_protocol_error(url: str) -> None:
    async with http_client(url) as client:
        with pytest.raises(MCPError, match="unknown tool 'jump'"):
            await client.call_tool("jump", {})


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}], ids=["no-token", "wrong-token"])
async def test_mcp_needs_the_token(url: str, headers: dict[str, str]) -> None:
    refused = metric(url, 'vistarl_env_errors_total{code="unauthorized"}')
    with pytest.RaisesGroup(MCPError, flatten_subgroups=True):  # raised out of the client's task group
        async with http_client(url, headers) as client:
            await client.list_tools()
    raw = httpx.post(f"{url}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, headers=headers)
    assert raw.status_code == 401 and raw.json()["error"]["code"] == "unauthorized"
    assert metric(url, 'vistarl_env_errors_total{code="unauthorized"}') >= refused + 2


@pytest.mark.parametrize("headers", [{}, AUTH], ids=["no-token", "token"])
@pytest.mark.parametrize(
    ("body", "code"),
    [(b"{}", -32600), (b"[1, 2]", -32600), (b'{"jsonrpc": "2.0"}', -32600), (b"{not json", -32700)],
)
def test_a_body_that_is_no_json_rpc_message_gets_openenvs_json_rpc_error_with_or_without_the_token(
    url: str, headers: dict[str, str], body: bytes, code: int
) -> None:
    """As OpenEnv's server answers it (200, a JSON-RPC error under a null id), which `openenv validate`
    asks of `POST /mcp {}`; without the token that is all a client learns."""
    answer = httpx.post(f"{url}/mcp", content=body, headers={**headers, "Content-Type": "application/json"})
    assert answer.status_code == 200, answer.text
    assert answer.json()["jsonrpc"] == "2.0" and answer.json()["id"] is None
    assert answer.json()["error"]["code"] == code


def test_a_long_body_without_the_token_is_refused_unread(url: str) -> None:
    junk = b"x" * (UNAUTHENTICATED_BODY_BYTES + 1)
    assert httpx.post(f"{url}/mcp", content=junk).status_code == 401
    assert httpx.post(f"{url}/mcp", content=junk, headers=AUTH).json()["error"]["code"] == -32700


@pytest.mark.parametrize(
    ("header", "status", "code"),
    [
        ({"Host": "evil.example"}, 421, "misdirected_request"),
        ({"Origin": "http://evil.example"}, 403, "forbidden"),
    ],
)
def test_a_loopback_server_refuses_other_hosts_and_origins_on_mcp(
    url: str, header: dict[str, str], status: int, code: str
) -> None:
    """DNS rebinding: a page of another name that resolves to 127.0.0.1 sends its own Host and Origin."""
    listing = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    accept = {"Accept": "application/json, text/event-stream"}
    rebound = httpx.post(f"{url}/mcp", json=listing, headers={**AUTH, **accept, **header})
    assert_error(rebound, status, code, f"Invalid {next(iter(header))} header", "loopback")


def test_get_on_mcp_is_405_as_no_stream_is_served(url: str) -> None:
    answer = httpx.get(f"{url}/mcp", headers={**AUTH, "Accept": "text/event-stream"}, timeout=5)
    assert_error(answer, 405, "bad_request", "no SSE stream")
    assert answer.headers["allow"] == "POST"
    assert httpx.get(f"{url}/mcp", timeout=5).status_code == 401


# In a fresh interpreter: the server answers /health without the MCP SDK, and /mcp imports it on first use.
LAZY_MCP = """
import json, sys, anyio, httpx
from vistarl.services.env_api import load_env_factory
from vistarl.services.server.app import create_app

async def main():
    app = create_app(load_env_factory("sokoban"))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8000") as client:
            health = (await client.get("/health")).status_code
            before = "mcp" in sys.modules
            listing = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
            accept = {"Accept": "application/json, text/event-stream"}
            answer = await client.post("/mcp", json=listing, headers=accept)
    tools = [tool["name"] for tool in answer.json()["result"]["tools"]]
    print(json.dumps({"health": health, "before": before, "after": "mcp" in sys.modules, "tools": tools}))

anyio.run(main)
"""


def test_the_server_imports_the_mcp_sdk_only_when_mcp_is_asked() -> None:
    done = subprocess.run([sys.executable, "-c", LAZY_MCP], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["health"] == 200 and seen["before"] is False, "serving imported the MCP SDK up front"
    assert seen["after"] is True and set(seen["tools"]) == TOOLS


async def test_stdio_serves_the_same_tools() -> None:
    command = StdioServerParameters(command=sys.executable, args=["-m", "vistarl.cli.main", "mcp", "sokoban"])
    async with Client(command) as client:
        assert {tool.name for tool in (await client.list_tools()).tools} == TOOLS
        session, turns = await play_to_the_end(client, {"options": {"xsb": CORRIDOR}})
        assert [turn["done"] for turn in turns] == [False, True] and turns[-1]["info"]["success"] is True
        late = await client.call_tool("act", {"session_id": session, "action": "<answer>Left</answer>"})
        assert late.is_error and text(late).startswith("episode_done:")
