"""A VSI question: VSI-Bench's question types and its row schema (the env's `sample_model`).

A row has VSI-Bench's columns: `id`, `dataset`, `scene_name`, `question_type`, `question`,
`ground_truth` and `options`. Multiple-choice rows have options "A. left", "B. right", … and a letter
as ground truth; numeric rows have no options and a number as ground truth. The scene must be one the
env can render (a VSI-Bench scene, or a synthetic `synth-N` room) and `dataset` must be its source.
"""

from __future__ import annotations

import string
from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from typing_extensions import Self

from vistarl.services.vsi.catalog import get_scene
from vistarl.services.vsi.scenes import SceneError


class QuestionType(str, Enum):
    """VSI-Bench's question types, by its names."""

    OBJECT_COUNTING = "object_counting"
    OBJECT_ABS_DISTANCE = "object_abs_distance"
    OBJECT_SIZE_ESTIMATION = "object_size_estimation"
    ROOM_SIZE_ESTIMATION = "room_size_estimation"
    OBJECT_REL_DISTANCE = "object_rel_distance"
    OBJECT_REL_DIRECTION_EASY = "object_rel_direction_easy"
    OBJECT_REL_DIRECTION_MEDIUM = "object_rel_direction_medium"
    OBJECT_REL_DIRECTION_HARD = "object_rel_direction_hard"
    ROUTE_PLANNING = "route_planning"
    OBJ_APPEARANCE_ORDER = "obj_appearance_order"

    @property
    def numeric(self) -> bool:
        """Scored by MRA (a number) rather than by an exact letter."""
        return self in NUMERIC_TYPES

    @property
    def task(self) -> str:
        """The task it is scored under: the three relative-direction levels share one."""
        return DIRECTION_TASK if self in DIRECTION_TYPES else self.value


NUMERIC_TYPES = frozenset(
    {
        QuestionType.OBJECT_COUNTING,
        QuestionType.OBJECT_ABS_DISTANCE,
        QuestionType.OBJECT_SIZE_ESTIMATION,
        QuestionType.ROOM_SIZE_ESTIMATION,
    }
)
DIRECTION_TYPES = (
    QuestionType.OBJECT_REL_DIRECTION_EASY,
    QuestionType.OBJECT_REL_DIRECTION_MEDIUM,
    QuestionType.OBJECT_REL_DIRECTION_HARD,
)
DIRECTION_TASK = "object_rel_direction"
TASKS: tuple[str, ...] = tuple(dict.fromkeys(qt.task for qt in QuestionType))
"""VSI-Bench's 8 tasks, in the order of `QuestionType`."""


def letter(index: int) -> str:
    """The option letter of position `index` (0 is A)."""
    return string.ascii_uppercase[index]


def lettered(choices: list[str]) -> list[str]:
    """Options as VSI-Bench writes them: "A. first", "B. second", …"""
    return [f"{letter(i)}. {choice}" for i, choice in enumerate(choices)]


class VsiQuestion(BaseModel):
    """One VSI-Bench-style question about one scene."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    id: int
    """The question's id within its data set."""
    dataset: str
    """Where the scene comes from: arkitscenes, scannet, scannetpp, or synthetic."""
    scene_name: str = Field(min_length=1)
    """A VSI-Bench scene name, or synth-N for a synthetic training room."""
    question_type: QuestionType
    question: str = Field(min_length=1, max_length=4096)
    ground_truth: str = Field(min_length=1)
    """A number (numeric types) or the correct option's letter."""
    options: list[str] | None = None
    """Multiple choice: "A. …", "B. …" in order; numeric questions have none."""

    @field_validator("options", mode="before")
    @classmethod
    def _plain_list(cls, value: Any) -> Any:
        """Accept numpy arrays (as pandas gives for parquet list columns); an empty list means none."""
        if hasattr(value, "tolist"):
            value = value.tolist()
        return value or None

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        try:
            scene = get_scene(self.scene_name)
        except SceneError as exc:
            raise ValueError(f"scene_name: {exc}") from None
        if self.dataset != scene.dataset:
            raise ValueError(
                f"dataset: scene {self.scene_name!r} is from {scene.dataset!r}, not {self.dataset!r}"
            )
        if self.question_type.numeric:
            self._check_numeric()
        else:
            self._check_choice()
        return self

    def _check_numeric(self) -> None:
        if self.options:
            raise ValueError(f"options: a {self.question_type.value} question has none")
        try:
            value = float(self.ground_truth)
        except ValueError:
            raise ValueError(f"ground_truth: {self.ground_truth!r} is not a number") from None
        if not value >= 0:
            raise ValueError(f"ground_truth: {self.ground_truth!r} must be a non-negative number")

    def _check_choice(self) -> None:
        if not self.options or len(self.options) < 2:
            raise ValueError(f"options: a {self.question_type.value} question needs at least 2")
        for i, option in enumerate(self.options):
            if not option.startswith(f"{letter(i)}. "):
                raise ValueError(f"options: option {i} {option!r} should start with '{letter(i)}. '")
        letters = [letter(i) for i in range(len(self.options))]
        if self.ground_truth not in letters:
            raise ValueError(
                f"ground_truth: {self.ground_truth!r} is not one of the option letters {letters}"
            )

    def choices(self) -> list[str]:
        """The options without their letters."""
        return [option.split(". ", 1)[1] for option in self.options or []]
