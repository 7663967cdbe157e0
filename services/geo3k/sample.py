"""One Geo3k task as data: a row in the Geometry3K schema (the env's `sample_model`).

- `problem`: the problem text with one `<image>` placeholder per diagram (Geometry3K starts with it);
- `answer`: the reference answer's value (a number or LaTeX, e.g. `2\\sqrt{3}`);
- `images`: the diagrams as image data URLs (PNG, JPEG or WebP), in placeholder order;
- `choices` (optional): the multiple-choice values, lettered A, B, ...; `answer` is one of them, or
  its letter, which is read as that choice;
- `id` (optional): the row's id in its source.
Every check names its field, so a bad row sent as `/reset`'s `sample` is a 422 that says what is wrong.
"""

from __future__ import annotations

import string
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator
from typing_extensions import Self

from vistarl.clients.images import decode_image

IMAGE_PLACEHOLDER = "<image>"
MAX_IMAGES = 8
MAX_CHOICES = 8
LETTERS = string.ascii_uppercase[:MAX_CHOICES]


def _decodable(url: str) -> str:
    """A data URL whose image decodes within the default image limits; an `ImageError` (a ValueError)
    says why not, and tells the server to answer `invalid_image`."""
    decode_image(url)
    return url


ImageURL = Annotated[str, AfterValidator(_decodable)]
Text = Annotated[str, Field(min_length=1, max_length=1024)]


class Geo3kSample(BaseModel):
    """A geometry problem with its diagrams and reference answer."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    problem: str = Field(min_length=1, max_length=16_384)
    """Problem text with one `<image>` per image."""
    answer: Text
    """The reference answer's value (or, with `choices`, its letter)."""
    images: list[ImageURL] = Field(min_length=1, max_length=MAX_IMAGES)
    """The diagrams as image data URLs."""
    choices: list[Text] | None = Field(default=None, min_length=2, max_length=MAX_CHOICES)
    """Multiple-choice values, lettered A, B, ... in order."""
    id: int | str | None = None
    """The row's id in its source data set."""

    @field_validator("images", "choices", mode="before")
    @classmethod
    def _plain_list(cls, value: Any) -> Any:
        """Accept numpy arrays (pandas' form of parquet list columns) as lists."""
        return value.tolist() if hasattr(value, "tolist") else value

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        placeholders = self.problem.count(IMAGE_PLACEHOLDER)
        if placeholders != len(self.images):
            raise ValueError(
                f"problem: has {placeholders} {IMAGE_PLACEHOLDER} placeholders for {len(self.images)} images"
            )
        if self.choices is not None:
            self.answer = self._answer_among_choices(self.choices)
        return self

    def _answer_among_choices(self, choices: list[str]) -> str:
        """The answer as a choice's value: a letter is read as that choice; other values must be one."""
        if len(set(choices)) != len(choices):
            raise ValueError("choices: the values must be distinct")
        letter = self.answer.strip()
        if letter in LETTERS[: len(choices)]:
            return choices[LETTERS.index(letter)]
        if self.answer not in choices:
            raise ValueError(f"answer: {self.answer!r} is neither one of the choices nor a choice letter")
        return self.answer
