"""Reading moves out of a model's response, exactly as the seed does."""

from __future__ import annotations

import re

from services.sokoban.game import DIRECTIONS

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.IGNORECASE | re.DOTALL)
_SEPARATORS = re.compile(r"[,;\s]+")


def parse_actions(response: str, limit: int = 3) -> list[str]:
    """The first `limit` moves ('up', 'down', 'left', 'right') of the first <answer> block, else of the text.

    Tokens are split on commas, semicolons and whitespace (newlines included), matched
    case-insensitively; anything that is not a move is skipped.
    """
    match = _ANSWER.search(response)
    candidate = match.group(1) if match else response
    moves = [token.lower() for token in _SEPARATORS.split(candidate) if token.lower() in DIRECTIONS]
    return moves[:limit]
