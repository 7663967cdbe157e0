"""The Geo3k env options (the `options` of `/reset`, the `**config` of `build_env`), validated once."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class Geo3kOptions(BaseModel):
    """Episode length, the grading budget, how choices are shown, and the vime fork's ending rule."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    max_turns: int = Field(default=3, ge=1, le=32)
    """Model turns per episode; the final-answer warning starts at turn index max_turns - 2."""
    grade_timeout_s: float = Field(default=5.0, gt=0.0, le=120.0)
    """Longest one grading may take; past it the answer scores 0 and the timeout is counted."""
    show_choices: bool = True
    """List a multiple-choice problem's choices (A, B, ...) under it; a letter then counts as an answer.
    False shows the problem text alone, as the seed's processed data does."""
    end_on_correct: bool = False
    """The vime fork's rule: a correct `calc_score` call ends the episode (the seed's does not)."""
