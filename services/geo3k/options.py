"""The Geo3k env options (the `options` of `/reset`, the `**config` of `build_env`), validated once."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from typing_extensions import Self


class Geo3kOptions(BaseModel):
    """Episode length, the grading budget, how choices are shown, what `calc_score` tells, and the vime
    fork's ending rule."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    max_turns: int = Field(default=3, ge=1, le=32)
    """Model turns per episode; the final-answer warning starts at turn index max_turns - 2."""
    grade_timeout_s: float = Field(default=5.0, gt=0.0, le=120.0)
    """Longest one grading may take; past it the answer scores 0 and the timeout is counted."""
    show_choices: bool = True
    """List a multiple-choice problem's choices (A, B, ...) under it; a letter then counts as an answer.
    False shows the problem text alone, as the seed's processed data does."""
    calc_score: Literal["oracle", "format"] = "oracle"
    """What a `calc_score` call tells the model. "oracle" (the seed's): whether the answer is right, so
    trying the choices one by one reaches reward 1 whenever `max_turns` allows (docs/geo3k.md, "What the
    checker tells"). "format": only that the call was well formed and its answer recorded; the answer is
    graded only as the final one."""
    end_on_correct: bool = False
    """The vime fork's rule: a correct `calc_score` call ends the episode (the seed's does not); needs
    `calc_score: oracle`."""

    @model_validator(mode="after")
    def _correct_needs_the_oracle(self) -> Self:
        if self.end_on_correct and self.calc_score != "oracle":
            raise ValueError("end_on_correct needs calc_score: oracle (a format-only check grades no call)")
        return self
