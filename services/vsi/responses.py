"""Reading one turn out of a model's response: an action, an answer, or neither.

An `<answer>…</answer>` ends the episode whatever else the response holds; otherwise the first
`<action>…</action>` is the turn's action (one per turn). Tags and action names are matched
case-insensitively.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from vistarl.services.vsi.camera import Action

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.IGNORECASE | re.DOTALL)
_ACTION = re.compile(r"<action>(.*?)</action>", re.IGNORECASE | re.DOTALL)
_NAMES = {action.value: action for action in Action}


@dataclass(frozen=True)
class Turn:
    """What a response asks for: `answer` text, or an `action`, or neither (then `problem` says why)."""

    answer: str | None = None
    action: Action | None = None
    problem: str | None = None


def parse_turn(response: str) -> Turn:
    """The answer, else the first action, of a response; a `problem` names what is wrong with it."""
    answer = _ANSWER.search(response)
    if answer is not None:
        return Turn(answer=answer.group(1).strip())
    action = _ACTION.search(response)
    if action is None:
        return Turn(problem="no <action>NAME</action> or <answer>X</answer> found")
    name = action.group(1).strip().lower()
    if name not in _NAMES:
        return Turn(problem=f"unknown action {name[:40]!r}; use one of {', '.join(_NAMES)}")
    return Turn(action=_NAMES[name])
