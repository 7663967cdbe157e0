"""Conversions between the in-process env world (PIL images, free-form info) and the wire models.

Envs return observations with PIL images and messages whose image parts hold PIL images or data URLs;
the wire carries PNG data URLs only. Env `info` may hold numpy values; it leaves as plain JSON data.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from PIL import Image
from pydantic import TypeAdapter
from pydantic_core import to_jsonable_python

from vistarl.clients.images import decode_image, encode_image
from vistarl.clients.protocol import ContentPart, ImagePart, ImageURL, Message, Observation
from vistarl.services.env_api import EnvObservation

_CONTENT_PART: TypeAdapter[ContentPart] = TypeAdapter(ContentPart)


def json_safe(value: Any) -> Any:
    """`value` as plain JSON data: numpy scalars/arrays via `tolist()`, non-finite floats as None (which
    JSON cannot carry), in one pass of pydantic-core."""
    return to_jsonable_python(value, fallback=_fallback, inf_nan_mode="null")


def _fallback(value: Any) -> Any:
    """Serialize what pydantic does not know: numpy-like values by `tolist()`, anything else by `str()`."""
    tolist = getattr(value, "tolist", None)
    return tolist() if callable(tolist) else str(value)


ImageUrl = Callable[[Image.Image | str], str]


def _image_url(image: Image.Image | str) -> str:
    """A data URL for an image given either as PIL or already as a data URL."""
    return encode_image(image) if isinstance(image, Image.Image) else image


class _ImageUrls:
    """`_image_url`, each PIL image encoded once: for one answer's observation and its message."""

    def __init__(self) -> None:
        self._urls: dict[int, tuple[Image.Image, str]] = {}  # by id, the image kept so its id stays its own

    def __call__(self, image: Image.Image | str) -> str:
        if not isinstance(image, Image.Image):
            return image
        known = self._urls.get(id(image))
        if known is None:
            known = self._urls[id(image)] = (image, encode_image(image))
        return known[1]


def answer_to_wire(obs: EnvObservation, message: dict[str, Any] | None) -> tuple[Observation, Message | None]:
    """An env answer's observation and (if asked for) its formatted message, each of their PIL images
    encoded once: the default message (`user_message`) holds the observation's own images."""
    urls = _ImageUrls()
    return observation_to_wire(obs, urls), None if message is None else message_to_wire(message, urls)


def observation_to_wire(obs: EnvObservation, image_url: ImageUrl = _image_url) -> Observation:
    """Encode an env observation; keys other than text and images travel as metadata."""
    metadata = {key: value for key, value in obs.items() if key not in ("text", "images")}
    return Observation(
        text=obs["text"],
        images=[image_url(image) for image in obs["images"]],
        metadata=json_safe(metadata),
    )


def observation_from_wire(obs: Observation, *, max_bytes: int, max_pixels: int) -> EnvObservation:
    """Decode a client's observation within the image limits; raises `ImageError` on a bad image."""
    images = [decode_image(url, max_bytes=max_bytes, max_pixels=max_pixels) for url in obs.images]
    return EnvObservation(text=obs.text, images=images)


def message_to_wire(raw: dict[str, Any], image_url: ImageUrl = _image_url) -> Message:
    """Validate an env-formatted chat message, encoding PIL images in its image parts.

    Accepts OpenAI parts (`{"type": "image_url", "image_url": {"url": PIL or str}}`) and the
    Qwen-style shorthand `{"type": "image", "image": PIL or str}`.
    """
    content = raw.get("content", "")
    if isinstance(content, str):
        return Message(role=raw.get("role", "user"), content=content)
    return Message(role=raw.get("role", "user"), content=[_part_to_wire(part, image_url) for part in content])


def _part_to_wire(part: dict[str, Any], image_url: ImageUrl) -> ContentPart:
    """One content part of a message, with its image (if any) as a data URL."""
    if part.get("type") == "image":
        return ImagePart(image_url=ImageURL(url=image_url(part["image"])))
    if part.get("type") == "image_url":
        return ImagePart(image_url=ImageURL(url=image_url(part["image_url"]["url"])))
    return _CONTENT_PART.validate_python(part)
