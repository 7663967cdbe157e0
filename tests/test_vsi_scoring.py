"""VSI-Bench scoring: answer parsing, MRA at 0 / partial / full, exact letters, and the aggregate."""

from __future__ import annotations

import pytest

from vistarl.services.vsi.question import QuestionType
from vistarl.services.vsi.scoring import (
    MRA_THRESHOLDS,
    aggregate,
    mean_relative_accuracy,
    parse_answer,
    score_answer,
)

QT = QuestionType


def test_the_ten_thresholds() -> None:
    assert list(MRA_THRESHOLDS) == pytest.approx([0.5 + 0.05 * k for k in range(10)])


@pytest.mark.parametrize(
    ("prediction", "target", "expected"),
    [
        (100, 100, 1.0),  # exact: every threshold
        (104, 100, 1.0),  # 4% off is within 1 - 0.95
        (112, 100, 0.8),  # 12% off: thresholds 0.50 … 0.85 hold, 0.90 and 0.95 fail
        (70, 100, 0.5),  # 30% off: 0.50 … 0.70
        (151, 100, 0.0),  # more than 50% off: none
        (0, 100, 0.0),
        (2.0, 4.0, 1 / 10),  # 50% off holds only θ = 0.5
    ],
)
def test_mra_against_the_formula(prediction: float, target: float, expected: float) -> None:
    assert mean_relative_accuracy(prediction, target) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("text", "token"),
    [
        ("A", "A"),
        ("B.", "B"),
        ("  c. right", "c"),
        ("3.5 meters", "3.5"),
        ("12.\n", "12"),
        ("", None),
        ("...", None),
        ("\n\t", None),
    ],
)
def test_parsing_takes_the_first_token_without_trailing_dots(text: str, token: str | None) -> None:
    assert parse_answer(text) == token


@pytest.mark.parametrize(
    ("question_type", "truth", "answer", "score"),
    [
        (QT.OBJECT_COUNTING, "4", "4", 1.0),
        (QT.OBJECT_COUNTING, "4", "four", 0.0),  # unparseable number
        (QT.ROOM_SIZE_ESTIMATION, "20.0", "22.5 square meters", 0.8),  # 12.5% off
        (QT.OBJECT_ABS_DISTANCE, "2.0", "", 0.0),
        (QT.OBJECT_ABS_DISTANCE, "2.0", "nan", 0.0),
        (QT.OBJECT_REL_DISTANCE, "C", "C. sofa", 1.0),
        (QT.OBJECT_REL_DISTANCE, "C", "c", 1.0),
        (QT.OBJECT_REL_DISTANCE, "C", "The answer is C", 1.0),
        (QT.OBJECT_REL_DISTANCE, "B", "(B)", 1.0),
        (QT.OBJECT_REL_DISTANCE, "B", "Answer: B", 1.0),
        (QT.OBJECT_REL_DISTANCE, "B", "answer: (b).", 1.0),
        (QT.OBJECT_REL_DISTANCE, "B", "\\text{B}", 1.0),
        (QT.OBJECT_REL_DISTANCE, "B", "BC", 0.0),
        (QT.OBJECT_REL_DISTANCE, "C", "sofa C", 0.0),
        (QT.ROUTE_PLANNING, "A", "B", 0.0),
    ],
)
def test_scores(question_type: QuestionType, truth: str, answer: str, score: float) -> None:
    assert score_answer(question_type, truth, answer) == pytest.approx(score)


def test_aggregate_averages_direction_levels_then_the_eight_tasks() -> None:
    per_type = {
        QT.OBJECT_COUNTING: [1.0, 0.5],
        QT.OBJECT_ABS_DISTANCE: [0.2],
        QT.OBJECT_SIZE_ESTIMATION: [0.4, 0.6, 0.8],
        QT.ROOM_SIZE_ESTIMATION: [0.0],
        QT.OBJECT_REL_DISTANCE: [1.0, 0.0, 0.0, 0.0],
        QT.OBJECT_REL_DIRECTION_EASY: [1.0],
        QT.OBJECT_REL_DIRECTION_MEDIUM: [0.0, 1.0],
        QT.OBJECT_REL_DIRECTION_HARD: [0.0, 0.0, 0.0],
        QT.ROUTE_PLANNING: [1.0, 1.0],
        QT.OBJ_APPEARANCE_ORDER: [0.0, 1.0, 1.0, 1.0],
    }
    result = aggregate((qt, s) for qt, scores in per_type.items() for s in scores)
    means = {qt: sum(scores) / len(scores) for qt, scores in per_type.items()}
    direction = (1.0 + 0.5 + 0.0) / 3
    tasks = [0.75, 0.2, 0.6, 0.0, 0.25, direction, 1.0, 0.75]
    assert result["object_rel_direction"] == pytest.approx(100 * direction)
    assert result["object_counting"] == pytest.approx(100 * means[QT.OBJECT_COUNTING])
    assert result["obj_appearance_order"] == pytest.approx(75.0)
    assert result["overall"] == pytest.approx(100 * sum(tasks) / 8)
    assert result["object_rel_direction_medium"] == pytest.approx(50.0)


def test_aggregate_of_a_partial_run_averages_what_it_has() -> None:
    result = aggregate(
        [("object_counting", 1.0), ("object_rel_direction_hard", 0.0), ("route_planning", 0.5)]
    )
    assert result["object_rel_direction"] == 0.0
    assert result["overall"] == pytest.approx(100 * (1.0 + 0.0 + 0.5) / 3)
    assert "room_size_estimation" not in result
