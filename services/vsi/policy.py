"""A random policy for the dummy evaluation: a valid action, or now and then a valid-looking answer."""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

from vistarl.services.env_api import EpisodeScore
from vistarl.services.vsi.camera import Action
from vistarl.services.vsi.prompt import OPTIONS_HEADER
from vistarl.services.vsi.question import QuestionType, VsiQuestion, letter
from vistarl.services.vsi.scoring import aggregate

ANSWER_PROBABILITY = 0.2
OPTION_LINE = re.compile(r"^[A-Z]\. ")
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


def random_reply(conversation: str, rng: random.Random) -> str:
    """The random player's reply to a conversation (`vistarl eval --dummy`): mostly a random action, now and
    then an answer: a letter of the question's options when it lists some, else a number."""
    if rng.random() >= ANSWER_PROBABILITY:
        return f"<action>{rng.choice(list(Action)).value}</action>"
    _, listed, options = conversation.rpartition(f"{OPTIONS_HEADER}\n")
    count = sum(1 for line in options.splitlines() if OPTION_LINE.match(line)) if listed else 0
    return f"<answer>{letter(rng.randrange(count)) if count else f'{rng.uniform(1, 20):.1f}'}</answer>"


def benchmark(episodes: Sequence[EpisodeScore]) -> dict[str, float]:
    """VSI-Bench's per-task and overall scores (x100) of finished episodes, by their question type."""
    return aggregate(
        (episode.labels["question_type"], episode.metrics.get("score", 0.0))
        for episode in episodes
        if "question_type" in episode.labels
    )
