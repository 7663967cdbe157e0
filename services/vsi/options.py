"""The VSI env options (the `options` of `/reset`, the `**config` of `build_env`), validated once.

The question comes from a dataset row (`sample`) or is generated from the seed; `scene_name` and
`question_type` narrow what the seed generates, and `scene_set` says which rooms it draws from:
`train` (synthetic rooms, the default, so seeds never train on benchmark rooms) or `test` (VSI-Bench).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from typing_extensions import Self

from vistarl.services.vsi.catalog import get_scene, is_vsibench
from vistarl.services.vsi.generator import SceneSet
from vistarl.services.vsi.question import QuestionType
from vistarl.services.vsi.scenes import SceneError

ImageSide = Annotated[int, Field(ge=64, le=1024)]


class VsiOptions(BaseModel):
    """Which question, how frames look, and the episode's limits."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    seed: int | None = None
    """Question generator seed; drawn at random when omitted (the `/reset` seed takes precedence)."""
    scene_set: SceneSet = "train"
    """Rooms a generated question draws from: train (synthetic) or test (the 288 VSI-Bench rooms)."""
    scene_name: str | None = None
    """Generate the question in this room (a VSI-Bench scene name or synth-N)."""
    question_type: QuestionType | None = None
    """Generate a question of this VSI-Bench type."""
    image_size: ImageSide = 384
    """Side of every frame, in pixels."""
    show_tour: bool = True
    """Show the scripted tour's frames at reset (appearance-order questions refer to them)."""
    labels: bool = True
    """Write each visible object's category on the frames."""
    max_turns: int = Field(default=15, ge=1, le=100)
    """Turns before the episode ends unanswered (reward 0, truncated)."""
    coverage_reward: float = Field(default=0.0, ge=0.0, le=1.0)
    """Shaping: reward per unit of newly seen object fraction (0 turns it off)."""

    @field_validator("scene_name")
    @classmethod
    def _known_scene(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                get_scene(value)
            except SceneError as exc:
                raise ValueError(str(exc)) from None
        return value

    @model_validator(mode="after")
    def _scene_in_set(self) -> Self:
        """A scene given together with `scene_set` must belong to it."""
        if self.scene_name is not None and "scene_set" in self.model_fields_set:
            actual = "test" if is_vsibench(self.scene_name) else "train"
            if actual != self.scene_set:
                raise ValueError(
                    f"scene_name: {self.scene_name!r} is a {actual} room, not a {self.scene_set} one"
                )
        return self
