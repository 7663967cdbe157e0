"""Multiple-choice answers, read one way in every env (Geo3k and VSI; docs/geo3k.md, docs/vsi.md).

An answer names choice X when, after an optional `Answer:` / `The answer is` opening (any case), it is:
- the letter alone, in either case, optionally in brackets or `\\text{}` and followed by `.`, `:` or `)`:
  `B`, `b`, `(B)`, `[B]`, `B.`, `B)`, `\\text{B}`;
- or that, then a space and more text (the choice's own words): `B. sofa`, `(B) 2.5`; a letter with
  neither brackets nor punctuation before the text counts only in upper case (`B sofa`), since
  `b = 12` names a length, not a choice.
A letter that is not among the question's letters names no choice.
"""

from __future__ import annotations

import re

_OPENING = re.compile(r"(?:the\s+)?answer(?:\s+is)?\s*:?\s*", re.IGNORECASE)
_CHOICE = re.compile(
    r"[(\[]?\s*(?:\\(?:text|textbf|mathrm)\{)?\s*([A-Za-z])\s*\}?\s*([)\].:]*)(?:\s+(.+))?", re.DOTALL
)


def choice_letter(answer: str, letters: str) -> str | None:
    """The choice letter (upper case) that `answer` names, if it is one of `letters`; else None."""
    text = answer.strip()
    opening = _OPENING.match(text)
    match = _CHOICE.fullmatch(text[opening.end() :] if opening else text)
    if match is None:
        return None
    letter, marks, rest = match.groups()
    if rest and not marks and letter.islower():
        return None
    return letter.upper() if letter.upper() in letters else None
