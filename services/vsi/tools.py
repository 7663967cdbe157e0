"""The env's actions as OpenAI function tools, and the response text a tool call stands for."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vistarl.services.vsi.camera import ACTION_DESCRIPTIONS, Action

ANSWER_TOOL = "answer"

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": action.value,
            "description": f"Take one turn: {description}; you then see the new view.",
            "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
        },
    }
    for action, description in ACTION_DESCRIPTIONS.items()
] + [
    {
        "type": "function",
        "function": {
            "name": ANSWER_TOOL,
            "description": "Answer the question (a number, or an option's letter); this ends the episode.",
            "parameters": {
                "type": "object",
                "properties": {"answer": {"type": "string", "description": "A number or an option letter."}},
                "required": ["answer"],
                "additionalProperties": False,
            },
        },
    }
]


def tool_call_text(name: str, arguments: Mapping[str, Any]) -> str:
    """The response text that one tool call stands for: `<action>NAME</action>` or `<answer>X</answer>`."""
    if name == ANSWER_TOOL:
        if "answer" not in arguments:
            raise ValueError("answer: the answer tool needs an 'answer' argument")
        return f"<answer>{arguments['answer']}</answer>"
    if name not in {action.value for action in Action}:
        raise ValueError(
            f"unknown tool {name!r}; the tools are {', '.join(t['function']['name'] for t in TOOLS)}"
        )
    return f"<action>{name}</action>"
