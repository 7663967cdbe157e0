"""A random policy for the dummy evaluation: a valid action, or now and then a valid-looking answer."""

from __future__ import annotations

import random

from services.vsi.camera import Action
from services.vsi.question import QuestionType, VsiQuestion, letter

ANSWER_PROBABILITY = 0.2
NUMERIC_RANGES: dict[QuestionType, tuple[float, float]] = {
    QuestionType.OBJECT_COUNTING: (1, 10),
    QuestionType.OBJECT_ABS_DISTANCE: (0.2, 6.0),
    QuestionType.OBJECT_SIZE_ESTIMATION: (10, 300),
    QuestionType.ROOM_SIZE_ESTIMATION: (5, 60),
}
"""Where a random numeric answer is drawn from, per type (integers for counts)."""


def random_response(
    question: VsiQuestion, rng: random.Random, answer_probability: float = ANSWER_PROBABILITY
) -> str:
    """`<answer>X</answer>` with probability `answer_probability` (X a random letter or number in the type's
    usual range), else `<action>NAME</action>` with a random action."""
    if rng.random() < answer_probability:
        return f"<answer>{random_answer(question, rng)}</answer>"
    return f"<action>{rng.choice(list(Action)).value}</action>"


def random_answer(question: VsiQuestion, rng: random.Random) -> str:
    """A random option letter, or a random number in the question type's usual range."""
    if not question.question_type.numeric:
        return letter(rng.randrange(len(question.options or [])))
    low, high = NUMERIC_RANGES[question.question_type]
    if question.question_type is QuestionType.OBJECT_COUNTING:
        return str(rng.randint(int(low), int(high)))
    return f"{rng.uniform(low, high):.1f}"
