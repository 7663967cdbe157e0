"""The built-in generator, the generated splits, and the sample schema's validation."""

from __future__ import annotations

import collections
import random

import pytest
from pydantic import ValidationError

from vistarl.services.geo3k import ENV_FACTORY, Geo3kSample
from vistarl.services.geo3k.generator import TOPICS, generate
from vistarl.services.geo3k.generator.diagram import IMAGE_SIZE
from vistarl.services.geo3k.splits import SPLIT_SIZES, in_test, split_problem

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


# One problem of every template (and of each variant of the circle and inscribed-angle templates), with
# its answer worked out by hand from the numbers in its key, which the diagram labels.
HAND_COMPUTED = [
    # triangles
    (10, "pythagoras_hypotenuse:8,9", "\\sqrt{145}"),  # legs 8, 9: √(64 + 81)
    (33, "pythagoras_leg:6,18", "12 \\sqrt{2}"),  # leg 6, hypotenuse 18: √(324 − 36) = √288
    (5, "angle_sum:23,79", "78"),  # 180 − 23 − 79
    (17, "angle_sum_algebra:4,-4,4,35,53", "12"),  # (4x − 4) + (4x + 35) + 53 = 180 → 8x = 96
    (74, "exterior_angle:80,32", "148"),  # remote interiors 80 and 180 − 80 − 32 = 68: 80 + 68
    (142, "isosceles_base_angle:106", "37"),  # apex 106: (180 − 106) / 2
    (6, "similar_triangles:2/1,5,7,49", "14"),  # ratio 2 : 1, the matching side is 7: 2 · 7
    # circles
    (15, "circle_area:10,False", "100 \\pi"),  # radius 10: π · 10²
    (18, "circle_area:12,True", "144 \\pi"),  # diameter 24 labelled: radius 12, π · 12²
    (78, "circle_circumference:6,False", "12 \\pi"),  # radius 6: 2π · 6
    (158, "circle_circumference:2,True", "4 \\pi"),  # diameter 4 labelled: π · 4
    (22, "arc_length:30,11", "\\frac{11 \\pi}{6}"),  # 30/360 of 2π · 11
    (4, "sector_area:40,8", "\\frac{64 \\pi}{9}"),  # 40/360 of π · 8²
    (21, "inscribed_angle:136,False", "136"),  # inscribed angle 68 labelled: the arc is twice it
    (54, "inscribed_angle:106,True", "53"),  # arc 106 labelled: the inscribed angle is half of it
    (1, "chord_length:7,2", "6 \\sqrt{5}"),  # radius 7, 2 from the centre: 2√(49 − 4) = 2√45
    # parallel lines (slope φ; at a crossing angles 0 and 2 are φ, 1 and 3 are 180 − φ)
    (7, "transversal_angle:118,00,13", "62"),  # φ = 118 given; angle 3 at the other crossing: 180 − 118
    (13, "transversal_algebra:122,02,11,3,19", "13"),  # φ = 122; angle 1 = 58 = 3x + 19
    # polygons
    (25, "regular_interior:6", "120"),  # (6 − 2) · 180 / 6
    (24, "regular_exterior:6", "60"),  # 360 / 6
    (9, "interior_angle_sum:6", "720"),  # (6 − 2) · 180
    (0, "missing_polygon_angle:86,94,97", "83"),  # quadrilateral: 360 − (86 + 94 + 97)
    (11, "missing_polygon_angle:98,108,109,110", "115"),  # pentagon: 540 − 425
    # areas
    (42, "rectangle_area:9,10", "90"),  # 9 · 10
    (2, "rectangle_perimeter:4,13", "34"),  # 2 · (4 + 13)
    (28, "parallelogram_area:10,5,2", "50"),  # base 10, height 5 (the lean does not count)
    (43, "trapezoid_area:14,17,4", "62"),  # (14 + 17) / 2 · 4
    (31, "triangle_area:6,14", "42"),  # 6 · 14 / 2
    (14, "right_triangle_perimeter:10,12", "2 \\sqrt{61} + 22"),  # 10 + 12 + √(100 + 144) = 22 + 2√61
]


def test_every_template_and_variant_has_a_hand_computed_answer() -> None:
    computed = {key.split(":")[0] for _, key, _ in HAND_COMPUTED}
    for template in (template for templates in TOPICS.values() for template in templates):
        made = {template(random.Random(draw)).key.split(":")[0] for draw in range(12)}
        assert made <= computed, template.__name__


@pytest.mark.parametrize(("seed", "key", "answer"), HAND_COMPUTED, ids=[key for _, key, _ in HAND_COMPUTED])
def test_generated_answers_match_the_hand_computed_ones(seed: int, key: str, answer: str) -> None:
    problem = generate(seed)
    assert (problem.key, problem.answer) == (key, answer)
    assert problem.choices is None or answer in problem.choices
