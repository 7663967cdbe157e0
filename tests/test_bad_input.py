"""Bad input stays a 4xx: huge integers, deep nesting and odd strings, in every free-form field of every
env route (`/reset`'s options and sample, `/step`'s action and tool call, `/format`'s observation), sent
to Sokoban, Geo3k and VSI served with env worker processes. No answer is a 5xx, and the server still
plays an episode afterwards.

Bodies are written as JSON text, so that what no Python value gives (a number of 100 digits, nesting past
the parser's limit, a lone surrogate escape) reaches the server as a client would send it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from vistarl.devtools.servers import env_server

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


BODIES = {
    "reset options": ("/reset", '{"options": {"x": ODD}}'),
    "reset options, a known key": ("/reset", '{"options": {"max_turns": ODD}}'),
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
`ODD_TEXT` for its JSON text as a string."""


def body(template: str, odd: str, session: str, tool: str) -> str:
    """A body of `BODIES` with the odd value, the session and the env's first tool filled in."""
    filled = template.replace("SESSION", session).replace("TOOL", tool)
    return filled.replace("ODD_TEXT", json.dumps(odd)).replace("ODD", odd)


@pytest.fixture(scope="module", params=ENVS)
def served(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """An env served with one env worker process: its name and URL."""
    with env_server(request.param, "--env-workers", "1", "--max-sessions", "8") as url:
        yield request.param, url


def test_odd_input_in_every_free_form_field_is_never_a_5xx(served: tuple[str, str]) -> None:
    env, url = served
    with httpx.Client(base_url=url, timeout=60) as http:
        tool = http.get("/info").json()["tools"][0]["function"]["name"]
        answers = {}
        for odd_name, odd in ODD_VALUES.items():
            for field, (path, template) in BODIES.items():
                session = http.post("/reset", json={"seed": 1}).json()["session_id"]
                text = body(template, odd, session, tool)
                answer = http.post(path, content=text, headers={"content-type": "application/json"})
                answers[f"{field} = {odd_name}"] = (answer.status_code, answer.text[:300])
                http.delete(f"/sessions/{session}")
                if answer.status_code == 200 and path == "/reset":
                    http.delete(f"/sessions/{answer.json()['session_id']}")
        failures = {case: answer for case, answer in answers.items() if answer[0] >= 500}
        assert failures == {}, f"{env}: {failures}"
        assert http.post("/reset", json={"seed": 2}).status_code == 200, "the server still plays"


@pytest.mark.parametrize("env", ENVS)
def test_a_100_digit_integer_in_format_metadata_is_a_422_naming_the_field(env: str) -> None:
    with env_server(env) as url:
        body = f'{{"observation": {{"text": "x", "metadata": {{"n": {BIG}}}}}}}'
        answer = httpx.post(f"{url}/format", content=body, headers={"content-type": "application/json"})
    assert answer.status_code == 422, answer.text
    message = answer.json()["error"]["message"]
    assert "observation.metadata" in message and "n:" in message, message
