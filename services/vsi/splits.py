"""The built-in question splits: `test` over the 288 VSI-Bench rooms, `train` over synthetic rooms.

Both follow one cycle of 24 question types, three rows per task (one per relative-direction level) in
three rounds of the 8 tasks, so each split is balanced across VSI-Bench's 8 tasks, and the k-th
multiple-choice row of a type has its answer at letter k mod (options), which spreads the letters
evenly. Test rows take each scene's drafts
in turn (round r takes every scene's r-th draft, scenes in a fixed shuffled order), so the questions
spread over the rooms. Train row i is built on its own synthetic rooms (`synth-(64·i + j)`, the first
j that admits its type), on demand. No scene is in both splits: synthetic names never name a
VSI-Bench room.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Mapping
from typing import Any

from vistarl.services.env_api import TaskSplit
from vistarl.services.vsi.catalog import get_scene
from vistarl.services.vsi.generator import GenerationError, finish
from vistarl.services.vsi.question import DIRECTION_TYPES, QuestionType
from vistarl.services.vsi.scenes import vsibench_names
from vistarl.services.vsi.synth import synth_name
from vistarl.services.vsi.tasks import Draft, drafts

CYCLE: tuple[QuestionType, ...] = tuple(
    level if qt in DIRECTION_TYPES else qt
    for level in DIRECTION_TYPES
    for qt in QuestionType
    if qt not in DIRECTION_TYPES or qt is DIRECTION_TYPES[0]
)
"""Three rounds of the 8 tasks, the relative-direction task at a different level each round, so any
stretch of rows mixes the tasks."""
TEST_CYCLES = 32
"""768 test rows: 96 per task."""
TRAIN_CYCLES = 400
"""9,600 train rows: 1,200 per task."""
ROOMS_PER_TRAIN_ROW = 64


def type_and_rank(index: int) -> tuple[QuestionType, int]:
    """Row `index`'s question type, and how many rows of that type come before it."""
    cycles, offset = divmod(index, len(CYCLE))
    question_type = CYCLE[offset]
    return question_type, cycles * CYCLE.count(question_type) + CYCLE[:offset].count(question_type)


class TrainSplit:
    """Questions on synthetic rooms, built when asked for (row i always gives the same question)."""

    def __len__(self) -> int:
        return TRAIN_CYCLES * len(CYCLE)

    def __getitem__(self, index: int) -> dict[str, Any]:
        if not 0 <= index < len(self):
            raise IndexError(f"train has {len(self)} rows, no row {index}")
        question_type, rank = type_and_rank(index)
        for j in range(ROOMS_PER_TRAIN_ROW):
            scene = get_scene(synth_name(ROOMS_PER_TRAIN_ROW * index + j))
            found = drafts(scene, question_type)
            if found:
                rng = random.Random(f"vsi-train/{index}")
                correct_at = rank % max(len(found[0].choices), 1)
                return finish(found[0], scene, index, correct_at, rng).model_dump(mode="json")
        raise GenerationError(f"train row {index}: no synthetic room admits a {question_type.value} question")


class ListSplit:
    """Rows held in memory."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.rows[index]


@functools.cache
def test_split() -> ListSplit:
    """The VSI-Bench-room questions (built once per process)."""
    per_type = {qt: TEST_CYCLES * CYCLE.count(qt) for qt in QuestionType}
    pools = {qt: _round_robin(qt, n) for qt, n in per_type.items()}
    rows = []
    for index in range(TEST_CYCLES * len(CYCLE)):
        question_type, rank = type_and_rank(index)
        scene_name, draft = pools[question_type][rank]
        correct_at = rank % max(len(draft.choices), 1)
        question = finish(draft, get_scene(scene_name), index, correct_at, random.Random(f"vsi-test/{index}"))
        rows.append(question.model_dump(mode="json"))
    return ListSplit(rows)


def _round_robin(question_type: QuestionType, count: int) -> list[tuple[str, Draft]]:
    """`count` (scene name, draft) pairs of one type, taking every scene's r-th draft in round r (a scene's
    drafts are only made when its turn comes)."""
    names = list(vsibench_names())
    random.Random("vsi-test-scenes").shuffle(names)
    picked: list[tuple[str, Draft]] = []
    for round_ in range(max(count, 1)):
        for name in names:
            found = drafts(get_scene(name), question_type)
            if len(found) > round_:
                picked.append((name, found[round_]))
                if len(picked) == count:
                    return picked
    raise GenerationError(f"the VSI-Bench rooms admit fewer than {count} {question_type.value} questions")


def splits() -> Mapping[str, TaskSplit]:
    """The env's built-in splits, by name."""
    return {"train": TrainSplit(), "test": test_split()}
