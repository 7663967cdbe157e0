"""The built-in generator, the generated splits, and the sample schema's validation."""

from __future__ import annotations

import collections

import pytest
from pydantic import ValidationError

from services.geo3k import ENV_FACTORY, Geo3kSample
from services.geo3k.generator import TOPICS, generate
from services.geo3k.generator.diagram import IMAGE_SIZE
from services.geo3k.splits import SPLIT_SIZES, in_test, split_problem

SEEDS = range(300)


@pytest.fixture(scope="module")
def problems() -> list:
    return [generate(seed) for seed in SEEDS]


def test_a_seed_gives_the_same_problem_and_pixels() -> None:
    first, again = generate(77), generate(77)
    assert (first.problem, first.answer, first.choices, first.key) == (
        again.problem,
        again.answer,
        again.choices,
        again.key,
    )
    assert first.image.tobytes() == again.image.tobytes()


def test_problems_cover_every_topic_with_drawn_diagrams(problems: list) -> None:
    assert {p.topic for p in problems} == set(TOPICS)
    assert len({p.key.split(":")[0] for p in problems}) >= 20
    for problem in problems[:40]:
        assert problem.image.size == (IMAGE_SIZE, IMAGE_SIZE) and problem.image.mode == "L"
        dark = sum(1 for value in problem.image.tobytes() if value < 100)
        assert dark > 500, problem
        assert problem.problem.startswith("<image>") and problem.problem.count("<image>") == 1


def test_multiple_choice_problems_have_four_distinct_choices_with_the_answer_spread(problems: list) -> None:
    with_choices = [p for p in problems if p.choices]
    assert 0.3 < len(with_choices) / len(problems) < 0.7
    positions = collections.Counter(p.choices.index(p.answer) for p in with_choices)
    for problem in with_choices:
        assert len(problem.choices) == 4 == len(set(problem.choices)) and problem.answer in problem.choices
    assert set(positions) == {0, 1, 2, 3} and min(positions.values()) > len(with_choices) / 8


def test_generated_rows_validate_as_samples(problems: list) -> None:
    for problem in problems[:20]:
        sample = Geo3kSample.model_validate(problem.sample())
        assert (sample.problem, sample.answer, sample.choices) == (
            problem.problem,
            problem.answer,
            problem.choices,
        )


def test_train_and_test_are_disjoint_by_seed_and_by_content() -> None:
    train = [split_problem("train", index) for index in range(150)]
    test = [split_problem("test", index) for index in range(150)]
    assert not {p.seed for p in train} & {p.seed for p in test}
    assert not {p.key for p in train} & {p.key for p in test}
    assert all(in_test(p.key) for p in test) and not any(in_test(p.key) for p in train)
    assert {p.topic for p in test} == set(TOPICS)


def test_splits_are_lazy_deterministic_and_indexed() -> None:
    splits = ENV_FACTORY.splits()
    assert {name: len(split) for name, split in splits.items()} == SPLIT_SIZES
    row = splits["test"][17]
    assert row == splits["test"][17] and Geo3kSample.model_validate(row).id == row["id"]
    seed = int(row["id"].removeprefix("generated-"))
    assert generate(seed).problem == row["problem"]
    for bad in (-1, SPLIT_SIZES["test"]):
        with pytest.raises(IndexError):
            splits["test"][bad]


def sample_row(**changes: object) -> dict:
    return {**generate(5).sample(), **changes}


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"problem": "Find x."}, "problem"),
        ({"images": ["data:image/png;base64,AAAA"]}, "images.0"),
        ({"images": []}, "images"),
        ({"answer": "no such choice", "choices": ["1", "2", "3", "4"]}, "answer"),
        ({"choices": ["1", "1", "2", "3"], "answer": "2"}, "choices"),
        ({"answer": ""}, "answer"),
        ({"ground_truth": "A"}, "ground_truth"),
    ],
)
def test_a_bad_sample_names_its_field(changes: dict, field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        Geo3kSample.model_validate(sample_row(**changes))
    assert field in str(caught.value)


def test_a_choice_letter_as_answer_is_read_as_that_choice() -> None:
    sample = Geo3kSample.model_validate(sample_row(answer="C", choices=["1", "2", "3", "4"]))
    assert sample.answer == "3"
