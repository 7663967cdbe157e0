"""Tasks at reset: `/reset`'s `task_id` or `sample`, resolved to a sample of the env's `sample_model`.

A `TaskCatalog` holds the splits a server serves, the env's own (`EnvFactory.splits`) and those that
`--data` adds (`vistarl.services.datasets`), and turns a reset's task into the sample the env is created from:
- `task_id` `SPLIT/INDEX` names a row of a split: 422 `validation_error` when it is not of that form,
  404 `task_not_found` when there is no such row;
- `sample` is a row sent inline: 422 `invalid_sample` naming each bad field, 422 `invalid_image` naming
  an image that does not decode (the sample model's own check) or is over the server's image limits.
Reading a row and decoding images take time, so the session manager calls `resolve` in a thread.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from vistarl.clients.images import ImageError, decode_image
from vistarl.clients.protocol import Datasets, ErrorCode, ResetRequest, SplitInfo
from vistarl.httpserver.errors import ServiceError, describe_validation_errors
from vistarl.services.datasets import ParquetSplit, load_splits
from vistarl.services.env_api import EnvFactory, TaskSplit
from vistarl.services.server.settings import ServerSettings

IMAGE_URL_PREFIX = "data:image/"


class TaskCatalog:
    """The splits of one server and the sample model that validates their rows and inline samples."""

    def __init__(
        self,
        factory: EnvFactory,
        splits: Mapping[str, TaskSplit],
        *,
        max_image_bytes: int,
        max_image_pixels: int,
    ) -> None:
        self.env = factory.name
        self.sample_model = factory.sample_model
        self.splits = dict(splits)
        self.image_limits = {"max_bytes": max_image_bytes, "max_pixels": max_image_pixels}

    @classmethod
    def build(cls, factory: EnvFactory, settings: ServerSettings) -> TaskCatalog:
        """The env's own splits plus those of `settings.data`; raises ValueError when a name is taken
        twice, when the env takes no samples, or when the first row of a data split does not fit."""
        catalog = cls(
            factory,
            factory.splits(),
            max_image_bytes=settings.max_image_bytes,
            max_image_pixels=settings.max_image_pixels,
        )
        if (catalog.splits or settings.data) and catalog.sample_model is None:
            raise ValueError(f"env {factory.name!r} has no sample_model, so it cannot serve dataset splits")
        for path in settings.data:
            for name, split in load_splits(path).items():
                if name in catalog.splits:
                    raise ValueError(
                        f"split {name!r} of {path} clashes with a split the server holds already"
                    )
                catalog._check_first_row(split)
                catalog.splits[name] = split
        return catalog

    def _check_first_row(self, split: ParquetSplit) -> None:
        """Refuse a data split whose first row is not a sample of this env (the wrong env's data)."""
        try:
            if len(split):
                self._parse(split[0], prefix="")
        except ServiceError as exc:
            raise ValueError(f"row 0 of {split.path} is not a {self.env} sample: {exc.message}") from None

    def datasets(self) -> Datasets:
        """What `/info` says about the tasks: each split's name and size, and the sample schema."""
        return Datasets(
            splits=[SplitInfo(name=name, size=len(split)) for name, split in sorted(self.splits.items())],
            sample_schema=None if self.sample_model is None else self.sample_model.model_json_schema(),
        )

    def resolve(self, request: ResetRequest) -> BaseModel | None:
        """The validated sample a reset starts from, or None when it names no task (a seed, or nothing)."""
        if request.task_id is not None:
            return self._row(request.task_id)
        if request.sample is not None:
            return self._inline(request.sample)
        return None

    def _row(self, task_id: str) -> BaseModel:
        """Row `SPLIT/INDEX` of a split, validated; a row that does not fit is the server's fault (500)."""
        name, _, index_text = task_id.rpartition("/")
        if not name or not index_text.isdigit():
            raise ServiceError(
                ErrorCode.VALIDATION_ERROR, f"task_id: expected SPLIT/INDEX, e.g. test/17, got {task_id!r}"
            )
        split, index = self.splits.get(name), int(index_text)
        if split is None:
            held = ", ".join(sorted(self.splits)) or "none"
            raise ServiceError(ErrorCode.TASK_NOT_FOUND, f"no split {name!r} on this server (splits: {held})")
        if index >= len(split):
            raise ServiceError(
                ErrorCode.TASK_NOT_FOUND, f"no task {task_id}: split {name!r} has {len(split)} rows, from 0"
            )
        try:
            return self._parse(split[index], prefix="")
        except ServiceError as exc:
            message = f"task {task_id} of this server is not a valid sample: {exc.message}"
            raise ServiceError(ErrorCode.INTERNAL, message) from None

    def _inline(self, sample: dict[str, Any]) -> BaseModel:
        """A client's sample, validated, with every image data URL in it checked against the limits."""
        model = self._parse(sample, prefix="sample")
        for where, url in _image_urls(sample, "sample"):
            try:
                decode_image(url, **self.image_limits)
            except ImageError as exc:
                raise ServiceError(ErrorCode.INVALID_IMAGE, f"{where}: {exc}") from None
        return model

    def _parse(self, row: Mapping[str, Any], *, prefix: str) -> BaseModel:
        """`row` as the env's sample model; 422 `invalid_sample` naming each bad field (`sample.answer`), or
        `invalid_image` when every error is an image the model's own check refused (an `ImageError`)."""
        if self.sample_model is None:
            message = f"env {self.env!r} takes no samples; start it from a seed or its options"
            raise ServiceError(ErrorCode.INVALID_SAMPLE, message)
        try:
            return self.sample_model.model_validate(row)
        except ValidationError as exc:
            errors = exc.errors(include_url=False)
            images = all(isinstance(error.get("ctx", {}).get("error"), ImageError) for error in errors)
            code = ErrorCode.INVALID_IMAGE if images else ErrorCode.INVALID_SAMPLE
            raise ServiceError(code, describe_validation_errors(errors, prefix=prefix)) from None


def _image_urls(value: Any, where: str) -> Iterator[tuple[str, str]]:
    """Every image data URL inside JSON data, with its path (`sample.images.0`)."""
    if isinstance(value, str) and value.startswith(IMAGE_URL_PREFIX):
        yield where, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _image_urls(item, f"{where}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _image_urls(item, f"{where}.{index}")
