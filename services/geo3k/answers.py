"""Pulling answers out of the model's own text: the last `\\boxed{...}`, and a bare choice letter."""

from __future__ import annotations

import re

BOXED = "\\boxed"
_LETTER_RE = re.compile(r"^\(?\s*(?:\\text\{|\\mathrm\{|\\textbf\{)?\s*([A-Z])\s*\}?\s*\)?\.?$")


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


def choice_letter(answer: str, letters: str) -> str | None:
    """The choice letter `answer` consists of ("B", "(B)", "B.", "\\text{B}"), if it is one of `letters`."""
    match = _LETTER_RE.match(answer.strip())
    if match is None or match.group(1) not in letters:
        return None
    return match.group(1)
