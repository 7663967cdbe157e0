"""Dotted `section.key=value` overrides (`--set`) of a config's raw mapping, checked against its schema.

The value is read as YAML (`5`, `1e-6`, `[1, 9]`, `null`, or an empty value for None; everything after
the first `=` is the value). The key path is walked through the pydantic model before anything is set:
an unknown key is an error that suggests the closest valid one, a key below a plain value is an error,
and below a free-form mapping (`env.options`) any key goes. Sections the file left out are created.
"""

from __future__ import annotations

import difflib
import typing
from typing import Any

import yaml
from pydantic import BaseModel

__all__ = ["OverrideError", "apply_overrides", "parse_override", "section_at", "suggest_key"]


class OverrideError(ValueError):
    """An override that cannot be applied; the message names it and what is wrong."""


def apply_overrides(raw: dict[str, Any], overrides: list[str], schema: type[BaseModel]) -> None:
    """Set each `section.key=value` of `overrides` in `raw`, in order, its key path checked against
    `schema`."""
    for item in overrides:
        keys, value = parse_override(item, schema)
        _set_dotted(raw, keys, value, item)


def parse_override(item: str, schema: type[BaseModel]) -> tuple[list[str], Any]:
    """Split `a.b.c=value` into its key path, checked against `schema`, and the value parsed as YAML."""
    dotted, sep, text = item.partition("=")
    keys = dotted.strip().split(".")
    if not sep or not all(keys):
        raise OverrideError(f"override {item!r} must look like section.key=value")
    _check_key_path(keys, item, schema)
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise OverrideError(f"override {item!r}: the value is not valid YAML ({exc})") from None
    return keys, value


def section_at(schema: type[BaseModel], loc: tuple[str, ...]) -> type[BaseModel] | None:
    """The section model at a dotted location of `schema`, or None below a plain value or a free-form
    mapping."""
    model = schema
    for key in loc:
        field = model.model_fields.get(key)
        annotation = field.annotation if field is not None else None
        if not _is_section(annotation):
            return None
        model = annotation
    return model


def suggest_key(key: str, model: type[BaseModel] | None) -> str:
    """A ` (did you mean ...?)` hint naming the closest valid key of `model`, or nothing."""
    if model is None:
        return ""
    close = difflib.get_close_matches(key, list(model.model_fields), n=1, cutoff=0.5)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _check_key_path(keys: list[str], item: str, schema: type[BaseModel]) -> None:
    """Walk `keys` through `schema`; unknown keys and keys below a plain value are errors."""
    model = schema
    for depth, key in enumerate(keys):
        dotted = ".".join(keys[: depth + 1])
        field = model.model_fields.get(key)
        if field is None:
            raise OverrideError(f"override {item!r}: unknown key {dotted!r}{suggest_key(key, model)}")
        annotation = field.annotation
        if typing.get_origin(annotation) is dict:
            return
        if not _is_section(annotation):
            if depth < len(keys) - 1:
                raise OverrideError(f"override {item!r}: {dotted!r} is a value, not a section")
            return
        model = annotation


def _set_dotted(raw: dict[str, Any], keys: list[str], value: Any, item: str) -> None:
    """Set `raw[k0][k1]...[kn] = value`, creating the sections that the file left out."""
    node = raw
    for depth, key in enumerate(keys[:-1]):
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            dotted = ".".join(keys[: depth + 1])
            raise OverrideError(f"override {item!r}: {dotted!r} in the config file is not a mapping")
        node = child
    node[keys[-1]] = value


def _is_section(annotation: Any) -> typing.TypeGuard[type[BaseModel]]:
    """Whether a field's annotation is a nested section model."""
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)
