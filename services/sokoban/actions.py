"""Reading moves out of a model's response, exactly as the seed does; and the random player's replies."""

from __future__ import annotations

import random
import re

from vistarl.services.sokoban.game import DIRECTIONS

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


def random_reply(conversation: str, rng: random.Random, max_moves: int = 3) -> str:
    """The random player's reply (`vistarl eval --dummy`): `<answer>m1, m2</answer>` with 1..`max_moves`
    random moves, whatever the conversation says."""
    moves = [rng.choice(list(DIRECTIONS)).capitalize() for _ in range(rng.randint(1, max_moves))]
    return f"<answer>{', '.join(moves)}</answer>"
