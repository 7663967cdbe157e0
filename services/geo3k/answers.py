"""Pulling answers out of the model's own text: the last `\\boxed{...}` (choice letters:
vistarl.services.choices)."""

from __future__ import annotations

BOXED = "\\boxed"


def last_boxed(text: str) -> str | None:
    """The contents of the last `\\boxed{...}` in `text` (braces balanced), or None if there is none."""
    start = text.rfind(BOXED + "{")
    while start != -1:
        contents = _braced(text, start + len(BOXED))
        if contents is not None:
            return contents
        start = text.rfind(BOXED + "{", 0, start)
    return None


def _braced(text: str, open_at: int) -> str | None:
    """What the brace at `open_at` encloses, or None when it is never closed."""
    depth = 0
    for index in range(open_at, len(text)):
        if text[index] == "{":
            depth += 1
        elif text[index] == "}":
            depth -= 1
            if depth == 0:
                return text[open_at + 1 : index]
    return None
