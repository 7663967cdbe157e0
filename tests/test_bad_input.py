"""Bad input gets the answer it should: huge integers, deep nesting and odd strings, in every free-form field
of every env route (`/reset`'s options and sample, `/step`'s action and tool call, `/format`'s observation),
sent to Sokoban, Geo3k and VSI served with env worker processes. Each case has its exact status and error
code (`expected`), and the same route with a valid value in that field answers 200 right after it.

Bodies are written as JSON text, so that what no Python value gives (a number of 100 digits, nesting past
the parser's limit, a lone surrogate escape) reaches the server as a client would send it.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator

import httpx
import pytest
from PIL import Image

from vistarl.clients.images import encode_image
from vistarl.devtools.servers import env_server
from vistarl.services.env_api import load_env_factory

ENVS = ("sokoban", "geo3k", "vsi")

BIG = "1" + "0" * 99
ODD_VALUES = {
    "a 100-digit integer": BIG,
    "a negative 100-digit integer": "-" + BIG,
    "2**64": str(2**64),
    "-2**63 - 1": str(-(2**63) - 1),
    "a float past the double range": "1e400",
    "nesting within the parser's limit": "[" * 150 + "1" + "]" * 150,
    "nesting past the parser's limit": '{"a":' * 300 + "1" + "}" * 300,
    "a lone surrogate": '"\\ud800"',
    "a NUL, a BOM and right-to-left text": '"a\\u0000b\\ufeff\\u202eabc"',
    "an emoji pair and a long string": json.dumps("\U0001f600" + "x" * 100_000),
    "an object with odd keys": '{"": 1, "\\u0000": [], "1e9": {"\\ud83d\\ude00": null}}',
    "an empty object": "{}",
}
"""Each odd value as JSON text."""


CHECKED_NUMBERS = {name for name in ODD_VALUES if "integer" in name or "2**" in name or "float" in name}
"""Values the body check refuses wherever they stand (422 validation_error): integers outside int64 and
uint64, floats past the double range, and (below) nesting deeper than it allows."""
UNPARSABLE = {"nesting past the parser's limit", "a lone surrogate"}
"""Values that make a body malformed JSON (400 bad_request); as the text of a tool call's arguments they are
a well-formed string, whose own parse refuses them (422 validation_error)."""
WELL_FORMED = (
    "a NUL, a BOM and right-to-left text",
    "an emoji pair and a long string",
    "an object with odd keys",
    "an empty object",
)
"""Values that are valid JSON of reasonable size: what becomes of them is the field's and the env's rule."""

KNOWN_OPTION = {"sokoban": "max_steps", "geo3k": "max_turns", "vsi": "max_turns"}
"""An integer option each env knows."""
TOOL_ARGUMENTS = {"sokoban": {"moves": ["Up"]}, "geo3k": {"answer": "1"}, "vsi": {}}
"""Valid arguments of each env's first tool."""

BODIES = {
    "reset options": ("/reset", '{"options": {"x": ODD}}'),
    "reset options, a known key": ("/reset", '{"options": {"KEY": ODD}}'),
    "reset sample": ("/reset", '{"sample": {"id": ODD, "extra_info": {"env_config": ODD}}}'),
    "reset sample, nested": ("/reset", '{"sample": {"extra_info": {"env_config": {"x": ODD}}}}'),
    "step action": ("/step", '{"session_id": "SESSION", "action": ODD}'),
    "step tool call arguments": (
        "/step",
        '{"session_id": "SESSION", "tool_call": {"name": "TOOL", "arguments": {"answer": ODD}}}',
    ),
    "step tool call arguments as text": (
        "/step",
        '{"session_id": "SESSION", "tool_call": {"name": "TOOL", "arguments": ODD_TEXT}}',
    ),
    "format metadata": ("/format", '{"observation": {"text": "x", "metadata": {"n": ODD}}}'),
    "format text": ("/format", '{"observation": {"text": ODD}}'),
    "format images": ("/format", '{"observation": {"images": [ODD]}}'),
}
"""Every free-form field of every route: (path, body as JSON text), `ODD` standing for the odd value and
`ODD_TEXT` for its JSON text as a string, `KEY` for `KNOWN_OPTION`."""

NEIGHBOURS = {
    "reset options": '{"options": {}}',
    "reset options, a known key": '{"options": {"KEY": 2}}',
    "reset sample": '{"sample": SAMPLE}',
    "reset sample, nested": '{"sample": SAMPLE}',
    "step action": '{"session_id": "SESSION", "action": "<answer>Up</answer>"}',
    "step tool call arguments": '{"session_id": "SESSION", "tool_call": {"name": "TOOL", "arguments": ARGS}}',
    "step tool call arguments as text": (
        '{"session_id": "SESSION", "tool_call": {"name": "TOOL", "arguments": ARGS_TEXT}}'
    ),
    "format metadata": '{"observation": {"text": "x", "metadata": {"n": 1}}}',
    "format text": '{"observation": {"text": "x"}}',
    "format images": '{"observation": {"images": [IMAGE]}}',
}
"""Each field of `BODIES` with a valid value: `SAMPLE` one of the env's own tasks, `ARGS` valid arguments
of its first tool (`ARGS_TEXT` as a string), `IMAGE` a PNG data URL."""

OK = (200, None)
OPTIONS, SAMPLE, VALIDATION = (422, "invalid_options"), (422, "invalid_sample"), (422, "validation_error")
WELL_FORMED_ANSWERS: dict[str, dict[str, tuple[tuple[int, str | None], ...]]] = {
    "reset options": {"*": (OPTIONS,) * 4},  # an option the env does not know
    "reset options, a known key": {"*": (OPTIONS,) * 4},  # not an integer
    # Sokoban's sample takes any id, and an empty env config is its default level
    "reset sample": {"*": (SAMPLE,) * 4, "sokoban": (SAMPLE, SAMPLE, SAMPLE, OK)},
    "reset sample, nested": {"*": (SAMPLE,) * 4},  # Geo3k's and VSI's samples have no extra_info
    # any text is an action (the env answers a bad reply as such) up to the action limit; an object is not
    "step action": {"*": (OK, VALIDATION, VALIDATION, VALIDATION)},
    # Geo3k's answer is a string (to the action limit); Sokoban's and VSI's tools take no `answer`
    "step tool call arguments": {"*": (VALIDATION,) * 4, "geo3k": (OK, VALIDATION, VALIDATION, VALIDATION)},
    # text that is no JSON object, or an object the tool's schema refuses; VSI's tool takes `{}`
    "step tool call arguments as text": {"*": (VALIDATION,) * 4, "vsi": (VALIDATION,) * 3 + (OK,)},
    "format metadata": {"*": (OK,) * 4},  # free-form
    "format text": {"*": (OK, OK, VALIDATION, VALIDATION)},
    "format images": {"*": ((422, "invalid_image"),) * 2 + (VALIDATION,) * 2},  # text, but no data URL
}
"""The answers to `WELL_FORMED`'s values, in its order, per field: every env's (`*`), or one env's own."""


def expected(env: str, field: str, odd_name: str) -> tuple[int, str | None]:
    """The status and error code (None for a 200) that `field` set to the odd value gets from `env`."""
    if odd_name in UNPARSABLE:
        return VALIDATION if field == "step tool call arguments as text" else (400, "bad_request")
    if odd_name in CHECKED_NUMBERS or odd_name == "nesting within the parser's limit":
        return VALIDATION
    answers = WELL_FORMED_ANSWERS[field]
    return answers.get(env, answers["*"])[WELL_FORMED.index(odd_name)]


def filled(template: str, env: str, session: str, tool: str, odd: str = "") -> str:
    """A body of `BODIES` or `NEIGHBOURS` with the odd value and the env's own names and values filled in
    (in one pass, so that nothing filled in is read as a placeholder)."""
    arguments = json.dumps(TOOL_ARGUMENTS[env])
    values = {
        "SESSION": session,
        "TOOL": tool,
        "KEY": KNOWN_OPTION[env],
        "SAMPLE": json.dumps(own_sample(env)),
        "ARGS": arguments,
        "ARGS_TEXT": json.dumps(arguments),
        "IMAGE": json.dumps(encode_image(Image.new("RGB", (8, 8), (200, 40, 40)))),
        "ODD": odd,
        "ODD_TEXT": json.dumps(odd),
    }
    return re.sub(r"\b(" + "|".join(values) + r")\b", lambda name: values[name[1]], template)


@functools.cache
def own_sample(env: str) -> dict[str, object]:
    """One of the env's own tasks as an inline sample (Sokoban's: a level from its options)."""
    if env == "sokoban":
        return {"id": 1, "extra_info": {"env_config": {"max_steps": 5}}}
    return dict(load_env_factory(env).splits()["test"][0])


@pytest.fixture(scope="module", params=ENVS)
def served(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """An env served with one env worker process: its name and URL."""
    with env_server(request.param, "--env-workers", "1", "--max-sessions", "8") as url:
        yield request.param, url


def test_odd_input_in_every_free_form_field_gets_its_exact_answer_and_a_valid_neighbour_200(
    served: tuple[str, str],
) -> None:
    env, url = served
    json_body = {"content-type": "application/json"}
    with httpx.Client(base_url=url, timeout=60) as http:
        tool = http.get("/info").json()["tools"][0]["function"]["name"]

        def post(path: str, template: str, odd: str = "") -> httpx.Response:
            session = http.post("/reset", json={"seed": 1}).json()["session_id"]
            answer = http.post(path, content=filled(template, env, session, tool, odd), headers=json_body)
            http.delete(f"/sessions/{session}")
            if answer.status_code == 200 and path == "/reset":
                http.delete(f"/sessions/{answer.json()['session_id']}")
            return answer

        wrong, neighbours = {}, {}
        for field, (path, template) in BODIES.items():
            for odd_name, odd in ODD_VALUES.items():
                answer = post(path, template, odd)
                code = answer.json()["error"]["code"] if answer.status_code != 200 else None
                if (answer.status_code, code) != expected(env, field, odd_name):
                    wrong[f"{field} = {odd_name}"] = (answer.status_code, code, answer.text[:200])
                neighbour = post(path, NEIGHBOURS[field])
                if neighbour.status_code != 200:
                    neighbours[f"{field} after {odd_name}"] = (neighbour.status_code, neighbour.text[:200])
        assert wrong == {}, f"{env}: {wrong}"
        assert neighbours == {}, f"{env}: {neighbours}"
        assert http.get("/ready").json()["active_sessions"] == 0


@pytest.mark.parametrize("env", ENVS)
def test_a_100_digit_integer_in_format_metadata_is_a_422_naming_the_field(env: str) -> None:
    with env_server(env) as url:
        body = f'{{"observation": {{"text": "x", "metadata": {{"n": {BIG}}}}}}}'
        answer = httpx.post(f"{url}/format", content=body, headers={"content-type": "application/json"})
    assert answer.status_code == 422, answer.text
    message = answer.json()["error"]["message"]
    assert "observation.metadata" in message and "n:" in message, message
