"""Whether two answers are the same number or expression, by math-verify's `parse` and `verify`.

Both answers are read as the contents of a `\\boxed{}` (one already boxed is taken as it is). Two
adjustments, both documented in docs/geo3k.md:
- a degree sign `°` is read as `^{\\circ}`, which math-verify already drops, so `60°` equals `60`;
- a reference written as a decimal is taken at its own precision: `verify` rounds floats to as many
  places as the reference has (at most 6, its default), so `3\\sqrt{2}` matches a reference of `4.24`.
math-verify's own timeouts use SIGALRM, which only works in a main thread; they are off here, and the
caller bounds the time instead (grading runs in `vistarl.services.geo3k.grade_worker` processes).
"""

from __future__ import annotations

import logging
import re

from math_verify import parse, verify

from vistarl.services.geo3k.answers import BOXED

DEFAULT_FLOAT_ROUNDING = 6
_DECIMAL_RE = re.compile(r"^\s*-?\d*\.(\d+)\s*$")

logging.getLogger("math_verify").setLevel(logging.ERROR)


def answers_match(candidate: str, reference: str) -> bool:
    """True when `candidate` is mathematically equal to `reference` (the gold answer)."""
    gold = parse(_boxed(reference), parsing_timeout=None)
    predicted = parse(_boxed(candidate.replace("°", "^{\\circ}")), parsing_timeout=None)
    if not gold or not predicted:
        return False
    return bool(verify(gold, predicted, float_rounding=_places(reference), timeout_seconds=None))


def _boxed(answer: str) -> str:
    """`answer` wrapped in `\\boxed{}` unless it already holds one."""
    return answer if BOXED in answer else f"{BOXED}{{{answer}}}"


def _places(reference: str) -> int:
    """Decimal places to compare floats at: the reference's own, if it is a decimal; else the default."""
    match = _DECIMAL_RE.match(reference)
    return min(len(match.group(1)), DEFAULT_FLOAT_ROUNDING) if match else DEFAULT_FLOAT_ROUNDING
