"""Conversions between the in-process env world (PIL images, free-form info) and the wire models.

Envs return observations with PIL images and messages whose image parts hold PIL images or data URLs;
the wire carries PNG data URLs only. Env `info` may hold numpy values; it leaves as plain JSON data.
"""

from __future__ import annotations

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


def _image_url(image: Image.Image | str) -> str:
    """A data URL for an image given either as PIL or already as a data URL."""
    return encode_image(image) if isinstance(image, Image.Image) else image


def observation_to_wire(obs: EnvObservation) -> Observation:
    """Encode an env observation; keys other than text and images travel as metadata."""
    metadata = {key: value for key, value in obs.items() if key not in ("text", "images")}
    return Observation(
        text=obs["text"],
        images=[_image_url(image) for image in obs["images"]],
        metadata=json_safe(metadata),
    )


def observation_from_wire(obs: Observation, *, max_bytes: int, max_pixels: int) -> EnvObservation:
    """Decode a client's observation within the image limits; raises `ImageError` on a bad image."""
    images = [decode_image(url, max_bytes=max_bytes, max_pixels=max_pixels) for url in obs.images]
    return EnvObservation(text=obs.text, images=images)


def message_to_wire(raw: dict[str, Any]) -> Message:
    """Validate an env-formatted chat message, encoding PIL images in its image parts.

    Accepts OpenAI parts (`{"type": "image_url", "image_url": {"url": PIL or str}}`) and the
    Qwen-style shorthand `{"type": "image", "image": PIL or str}`.
    """
    content = raw.get("content", "")
    if isinstance(content, str):
        return Message(role=raw.get("role", "user"), content=content)
    return Message(role=raw.get("role", "user"), content=[_part_to_wire(part) for part in content])


def _part_to_wire(part: dict[str, Any]) -> ContentPart:
    """One content part of a message, with its image (if any) as a data URL."""
    if part.get("type") == "image":
        return ImagePart(image_url=ImageURL(url=_image_url(part["image"])))
    if part.get("type") == "image_url":
        return ImagePart(image_url=ImageURL(url=_image_url(part["image_url"]["url"])))
    return _CONTENT_PART.validate_python(part)
