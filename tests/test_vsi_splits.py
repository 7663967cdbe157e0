"""The built-in VSI splits: balanced, lettered evenly, deterministic, and disjoint by scene; room-size
questions only where the drawn floor shows the layout's room size."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from vistarl.services.vsi import ENV_FACTORY, VsiQuestion
from vistarl.services.vsi.catalog import is_vsibench
from vistarl.services.vsi.generator import generate_question
from vistarl.services.vsi.question import TASKS, QuestionType
from vistarl.services.vsi.scenes import WALL_MARGIN, load_vsibench, vsibench_names
from vistarl.services.vsi.splits import TrainSplit, type_and_rank
from vistarl.services.vsi.tasks import drafts


def test_test_split_covers_the_vsibench_rooms_balanced_by_task() -> None:
    test = ENV_FACTORY.splits()["test"]
    rows = [VsiQuestion.model_validate(test[i]) for i in range(len(test))]
    assert all(is_vsibench(row.scene_name) for row in rows)
    tasks = Counter(row.question_type.task for row in rows)
    assert set(tasks) == set(TASKS) and len(set(tasks.values())) == 1
    levels = Counter(row.question_type for row in rows if row.question_type.task == "object_rel_direction")
    assert len(set(levels.values())) == 1
    assert len({row.scene_name for row in rows}) > 150
    for question_type in QuestionType:
        letters = Counter(
            row.ground_truth for row in rows if row.question_type is question_type and row.options
        )
        assert not letters or max(letters.values()) - min(letters.values()) <= 1, (question_type, letters)
    assert len({(row.scene_name, row.question) for row in rows}) == len(rows)


def test_train_split_uses_synthetic_rooms_only_and_rows_are_deterministic() -> None:
    train = TrainSplit()
    rows = [train[i] for i in range(24)]
    assert rows == [TrainSplit()[i] for i in range(24)]
    names = {row["scene_name"] for row in rows}
    assert not names & set(vsibench_names()) and all(name.startswith("synth-") for name in names)
    assert [row["question_type"] for row in rows] == [type_and_rank(i)[0].value for i in range(24)]
    assert Counter(QuestionType(row["question_type"]).task for row in rows) == dict.fromkeys(TASKS, 3)


def test_generated_questions_keep_to_their_scene_set() -> None:
    for seed in range(12):
        assert not is_vsibench(generate_question(seed, "train").scene_name)
        assert is_vsibench(generate_question(seed, "test").scene_name)


def test_every_room_is_drawn_with_its_room_size_where_the_objects_allow() -> None:
    """A room drawn larger than `room_size` is one whose objects (and centre) span more floor than that:
    its walls stand `WALL_MARGIN` off them. Those drawn more than 5% larger get no room-size question, and
    docs/vsi.md counts them."""
    larger = []
    for scene in load_vsibench().values():
        x0, y0, x1, y1 = scene.extent
        if scene.floor_area > scene.room_size * (1 + 1e-9):
            assert (x1 - x0 - 2 * WALL_MARGIN) * (y1 - y0 - 2 * WALL_MARGIN) >= scene.room_size, scene.name
            larger.append(scene)
        else:
            assert scene.floor_area == pytest.approx(scene.room_size), scene.name
        asked = drafts(scene, QuestionType.ROOM_SIZE_ESTIMATION)
        assert bool(asked) == (scene.floor_area <= scene.room_size * 1.05), scene.name
    unasked = sum(scene.floor_area > scene.room_size * 1.05 for scene in larger)
    counted = f"{len(load_vsibench()) - len(larger)} of the {len(load_vsibench())} rooms"
    docs = " ".join(Path("docs/vsi.md").read_text().split())
    assert counted in docs and f"{unasked} rooms" in docs and f"{len(larger)} rooms" in docs
