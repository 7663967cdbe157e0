"""Tool calls as actions: every env lists its actions as OpenAI function tools in `/info`, and `/step`
takes a call of one of them in place of the response text (a real `vistarl serve sokoban`)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.envs.serving import served
from tests.wire import assert_error
from vistarl.clients.protocol import InfoResponse, StepResponse, ToolCall
from vistarl.httpserver.errors import ServiceError
from vistarl.services.env_api import ENV_MODULES, load_env_factory
from vistarl.services.server.tool_calls import ToolActions

CORRIDOR = {"xsb": "########\n#@ $  .#\n########"}


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    with served("sokoban") as url, httpx.Client(base_url=url, timeout=30) as client:
        yield client


def start(http: httpx.Client) -> str:
    return str(http.post("/reset", json={"options": CORRIDOR}).json()["session_id"])


def act(moves: list[str], as_text: bool = False) -> dict[str, Any]:
    """A call of Sokoban's `act` tool, its arguments as an object or as JSON text (as OpenAI sends them)."""
    arguments = {"moves": moves}
    return {"name": "act", "arguments": json.dumps(arguments) if as_text else arguments}


@pytest.mark.parametrize("env", sorted(ENV_MODULES))
def test_every_env_lists_its_actions_as_function_tools(env: str) -> None:
    tools = load_env_factory(env).tools
    assert tools
    for tool in tools:
        assert tool["type"] == "function"
        assert tool["function"]["name"] and tool["function"]["description"]
        assert tool["function"]["parameters"]["type"] == "object"


def test_info_publishes_the_tools(http: httpx.Client) -> None:
    info = InfoResponse.model_validate(http.get("/info").json())
    assert info.tools == load_env_factory("sokoban").tools


def test_tool_calls_play_a_level_like_the_text_they_stand_for(http: httpx.Client) -> None:
    by_tool, by_text = start(http), start(http)
    for moves, as_text in ((["Right", "Right"], True), (["Right", "Right"], False)):
        called = http.post("/step", json={"session_id": by_tool, "tool_call": act(moves, as_text)})
        typed = http.post(
            "/step", json={"session_id": by_text, "action": f"<answer>{', '.join(moves)}</answer>"}
        )
        assert called.status_code == typed.status_code == 200, called.text
        assert StepResponse.model_validate(called.json()) == StepResponse.model_validate(typed.json())
    assert called.json()["done"] and called.json()["info"]["success"] is True


def test_a_resent_tool_call_does_not_step_twice(http: httpx.Client) -> None:
    body = {"session_id": start(http), "tool_call": act(["Right"]), "request_id": "turn-1"}
    first, again = http.post("/step", json=body), http.post("/step", json=body)
    assert first.json() == again.json()
    assert first.json()["info"]["metrics"]["steps"] == 1


@pytest.mark.parametrize(
    ("tool_call", "mentions"),
    [
        ({"name": "jump", "arguments": {}}, ["tool_call.name", "jump", "act"]),
        ({"name": "act", "arguments": "{moves: [Up]}"}, ["tool_call.arguments", "not JSON"]),
        ({"name": "act", "arguments": "[1]"}, ["tool_call.arguments", "JSON object"]),
        (act(["Jump"]), ["tool_call.arguments.moves.0", "Jump"]),
        ({"name": "act", "arguments": {}}, ["tool_call.arguments", "moves"]),
    ],
)
def test_a_bad_tool_call_is_a_422_naming_the_problem(
    http: httpx.Client, tool_call: dict[str, Any], mentions: list[str]
) -> None:
    answer = http.post("/step", json={"session_id": start(http), "tool_call": tool_call})
    assert_error(answer, 422, "validation_error", *mentions)


def test_an_action_and_a_tool_call_together_are_a_422(http: httpx.Client) -> None:
    body = {"session_id": start(http), "action": "<answer>Up</answer>", "tool_call": act(["Up"])}
    assert_error(http.post("/step", json=body), 422, "validation_error", "action", "tool_call")


def test_a_step_with_neither_action_nor_tool_call_says_so(http: httpx.Client) -> None:
    answer = http.post("/step", json={"session_id": start(http)})
    assert_error(answer, 422, "validation_error", "needs action", "or tool_call")


def test_a_tool_call_too_long_is_refused_as_a_tool_call(http: httpx.Client) -> None:
    limit = http.get("/info").json()["limits"]["max_action_chars"]
    moves = ["Up"] * (limit // 4)
    answer = http.post("/step", json={"session_id": start(http), "tool_call": act(moves)})
    assert_error(answer, 422, "validation_error", "tool_call: its arguments make a response of", str(limit))


def test_an_env_without_its_own_conversion_gets_the_tool_call_markup() -> None:
    quiz = load_env_factory("tests.envs.quiz")
    text = ToolActions(quiz).action(ToolCall(name="answer", arguments='{"answer": "4"}'))
    assert text.startswith("<tool_call>") and text.endswith("</tool_call>")
    assert json.loads(text.removeprefix("<tool_call>").removesuffix("</tool_call>")) == {
        "name": "answer",
        "arguments": {"answer": "4"},
    }
    with pytest.raises(ServiceError, match="has no tool"):
        ToolActions(load_env_factory("tests.envs.counter")).action(ToolCall(name="inc"))
