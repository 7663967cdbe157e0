"""Reading the model's tool call out of its response, by the seed's rules (docs/geo3k.md, "Tool calls").

- The call is the JSON object between `<tool_call>` and `</tool_call>`; with several, the last wins.
- The JSON is parsed strictly: anything `json.loads` refuses, or that is not an object, is no call.
- `name` and `arguments` stand at the top level or under `function`; `arguments` may itself be a JSON
  string holding the object.
- A call without a name is no call. The answer is `arguments["answer"]` as text ("" when absent).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from vistarl.services.env_api import TOOL_CALL_BLOCK

TOOL_NAMES = ("calc_score", "calc_geo3k_reward")
"""The names the checker answers to: the seed's instruction says `calc_score`, verl's `calc_geo3k_reward`."""


@dataclass(frozen=True)
class ToolCall:
    """A parsed call: the tool's name (the checker answers to `TOOL_NAMES`) and the answer it was given."""

    name: str
    answer: str


def parse_tool_call(text: str) -> ToolCall | None:
    """The last `<tool_call>` of `text`, or None when there is none or it is not a named JSON object."""
    matches = TOOL_CALL_BLOCK.findall(text)
    if not matches:
        return None
    try:
        payload = json.loads(matches[-1])
    except json.JSONDecodeError:
        return None
    if not isinstance(payload, dict):
        return None
    function = payload.get("function")
    nested = function if isinstance(function, dict) else {}
    name = payload.get("name") or nested.get("name")
    if not isinstance(name, str) or not name.strip():
        return None
    arguments = payload.get("arguments") or nested.get("arguments") or {}
    return ToolCall(name=name.strip(), answer=_answer(arguments))


def _answer(arguments: Any) -> str:
    """`arguments["answer"]` as text; arguments given as a JSON string are decoded first."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return ""
    if not isinstance(arguments, dict):
        return ""
    raw = arguments.get("answer")
    if raw is None:
        return ""
    return raw if isinstance(raw, str) else json.dumps(raw)
