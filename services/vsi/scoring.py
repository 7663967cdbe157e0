"""VSI-Bench's scoring: answer parsing, MRA for numbers, exact letters for choices, and the aggregate.

A numeric answer is read as VSI-Bench's evaluation reads a prediction: its first whitespace-separated
token with trailing "." removed; it scores its mean relative accuracy against the ground truth over the
10 thresholds 0.50, 0.55, …, 0.95. A multiple-choice answer is read as every env reads one
(`vistarl.services.choices`: `B`, `(B)`, `b.`, `Answer: B`, `B. sofa`, …) and scores 1 when it names the
correct letter. Anything unparseable scores 0.
"""

from __future__ import annotations

import math
import string
from collections import defaultdict
from collections.abc import Iterable

from vistarl.services.choices import choice_letter
from vistarl.services.vsi.question import DIRECTION_TASK, DIRECTION_TYPES, TASKS, QuestionType

MRA_THRESHOLDS = (0.50, 0.55, 0.60, 0.65, 0.70, 0.75, 0.80, 0.85, 0.90, 0.95)


def parse_answer(text: str) -> str | None:
    """The first whitespace-separated token, trailing dots removed; None when nothing is left."""
    tokens = text.split()
    token = tokens[0].rstrip(".") if tokens else ""
    return token or None


def to_number(token: str | None) -> float | None:
    """The token as a finite float, or None."""
    if token is None:
        return None
    try:
        value = float(token)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def mean_relative_accuracy(prediction: float, target: float) -> float:
    """The fraction of thresholds θ with |prediction − target| / target ≤ 1 − θ (target 0: exact match)."""
    if target == 0:
        return float(prediction == 0)
    error = abs(prediction - target) / abs(target)
    return sum(error <= 1 - theta for theta in MRA_THRESHOLDS) / len(MRA_THRESHOLDS)


def read_answer(question_type: QuestionType, answer: str) -> str | None:
    """What `answer` (the text inside the answer tag) says: a numeric question's first token, or the
    choice letter a multiple-choice answer names; None when it says nothing readable."""
    if question_type.numeric:
        return parse_answer(answer)
    return choice_letter(answer, string.ascii_uppercase)


def score_answer(question_type: QuestionType, ground_truth: str, answer: str) -> float:
    """The VSI-Bench score of `answer` (the text inside the answer tag) for one question."""
    said = read_answer(question_type, answer)
    if question_type.numeric:
        prediction, target = to_number(said), to_number(ground_truth)
        if prediction is None or target is None:
            return 0.0
        return mean_relative_accuracy(prediction, target)
    return float(said is not None and said == ground_truth.strip().upper())


def aggregate(scores: Iterable[tuple[QuestionType | str, float]]) -> dict[str, float]:
    """Per-task and overall scores (×100) from (question type, score) pairs, as VSI-Bench aggregates.

    Each question type's mean first; the three relative-direction levels are then averaged into one task;
    overall is the unweighted mean of the tasks. Only tasks (and levels) that have questions count, so a
    partial run averages what it has; with every type present this is VSI-Bench's formula exactly.
    """
    by_type: dict[QuestionType, list[float]] = defaultdict(list)
    for question_type, score in scores:
        by_type[QuestionType(question_type)].append(float(score))
    means = {qt: sum(values) / len(values) for qt, values in by_type.items()}
    tasks: dict[str, float] = {qt.value: mean for qt, mean in means.items() if qt not in DIRECTION_TYPES}
    levels = [means[qt] for qt in DIRECTION_TYPES if qt in means]
    if levels:
        tasks[DIRECTION_TASK] = sum(levels) / len(levels)
    result = {task: 100 * tasks[task] for task in TASKS if task in tasks}
    result.update({qt.value: 100 * means[qt] for qt in DIRECTION_TYPES if qt in means})
    if tasks:
        result["overall"] = 100 * sum(tasks.values()) / len(tasks)
    return result
