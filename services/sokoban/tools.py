"""Sokoban's action as an OpenAI function tool (`act`, taking the moves), and the response text a call
stands for: the seed's answer block."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vistarl.services.sokoban.game import DIRECTIONS

ACT_TOOL = "act"
MOVES = [direction.capitalize() for direction in DIRECTIONS]

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": ACT_TOOL,
            "description": (
                "Take one turn: make these moves in order (up to the turn's limit, 3 by default; more are "
                "ignored). A move into a wall or a blocked push does nothing and is penalised."
            ),
            "parameters": {
                "type": "object",
                "properties": {
                    "moves": {
                        "type": "array",
                        "items": {"type": "string", "enum": MOVES},
                        "minItems": 1,
                        "description": 'The moves, e.g. ["Up", "Left"].',
                    }
                },
                "required": ["moves"],
                "additionalProperties": False,
            },
        },
    }
]


def tool_call_text(name: str, arguments: Mapping[str, Any]) -> str:
    """The response text of an `act` call: `<answer>Up, Left</answer>`."""
    if name != ACT_TOOL:
        raise ValueError(f"unknown tool {name!r}; Sokoban's only tool is {ACT_TOOL!r}")
    return f"<answer>{', '.join(arguments['moves'])}</answer>"
