"""The image codec of the wire protocol: PIL image <-> base64 data URL, with hard size limits.

Images travel as `data:image/png;base64,...` strings (the form OpenAI `image_url` parts and SGLang's
`image_data` take). Decoding checks every limit before doing the expensive work: the base64 length
before decoding it, and the header's pixel count before decompressing the pixels.

Encoding is on every env step's path, so the common modes are written here rather than by Pillow: the
rows unfiltered and deflated by ISA-L at its level 1, several times faster than Pillow's PNG writer at
`compress_level=1` on the envs' frames and no larger (the figures in docs/benchmarks.md, "PNG encoding
and the env worker's memory").
"""

from __future__ import annotations

import base64
import binascii
import io
import struct
import zlib

from isal import isal_zlib
from PIL import Image, UnidentifiedImageError

from vistarl.clients.errors import ImageError

__all__ = [
    "DEFAULT_MAX_IMAGE_BYTES",
    "DEFAULT_MAX_IMAGE_PIXELS",
    "ImageError",
    "decode_image",
    "encode_image",
]

DEFAULT_MAX_IMAGE_BYTES = 8 * 1024 * 1024
DEFAULT_MAX_IMAGE_PIXELS = 4096 * 4096

_MEDIA_TYPES = {"image/png": "PNG", "image/jpeg": "JPEG", "image/jpg": "JPEG", "image/webp": "WEBP"}
_FORMATS = tuple(sorted(set(_MEDIA_TYPES.values())))
_PNG_MODES = {"1", "L", "LA", "P", "RGB", "RGBA", "I", "I;16"}
_PNG_COLOR_TYPES = {"L": 0, "RGB": 2, "P": 3, "LA": 4, "RGBA": 6}  # the 8-bit modes `_png` writes
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def encode_image(img: Image.Image) -> str:
    """Encode `img` as a PNG data URL."""
    return "data:image/png;base64," + base64.b64encode(png_bytes(img)).decode("ascii")


def png_bytes(img: Image.Image) -> bytes:
    """`img` as a PNG file: written by `_png` where it can, else by Pillow (converting a mode PNG cannot
    hold to RGB or RGBA)."""
    if _writes(img):
        return _png(img)
    if img.mode not in _PNG_MODES:
        img = img.convert("RGBA" if "A" in img.getbands() else "RGB")
    return pillow_png(img)


def pillow_png(img: Image.Image) -> bytes:
    """The PNG that Pillow writes of `img` at compress_level=1: the wire's writer for the modes `_png`
    leaves to it (and, in benchmarks.png_encoding, what `_png` is measured against)."""
    buf = io.BytesIO()
    img.save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def _writes(img: Image.Image) -> bool:
    """Whether `_png` writes `img`: an 8-bit L, LA, RGB, RGBA or P image with pixels and without
    transparency, a P image with an RGB palette of at least one colour."""
    if img.mode not in _PNG_COLOR_TYPES or not (img.width and img.height) or "transparency" in img.info:
        return False
    return img.mode != "P" or (
        img.palette is not None and img.palette.mode == "RGB" and bool(img.getpalette())
    )


def _png(img: Image.Image) -> bytes:
    """A PNG of `img` (`_writes`): rows without a filter, one IDAT deflated by ISA-L at level 1. A P
    image's palette goes as it is, and its indices in as few bits as the palette's size allows (1, 2
    or 4 bits for up to 2, 4 or 16 colours), as Pillow writes them."""
    import numpy as np  # on first use: a client that never encodes an image does not load it

    palette = bytes(img.getpalette() or ())[: 3 * 256] if img.mode == "P" else b""
    bits = next((bits for bits in (1, 2, 4) if palette and len(palette) <= 3 * 2**bits), 8)
    raw = img.tobytes("raw", f"P;{bits}") if bits < 8 else img.tobytes()
    rows = np.zeros((img.height, 1 + len(raw) // img.height), np.uint8)  # filter type 0 ahead of each row
    rows[:, 1:] = np.frombuffer(raw, np.uint8).reshape(img.height, -1)  # rows in whole bytes, as in PNG
    header = struct.pack(">IIBBBBB", img.width, img.height, bits, _PNG_COLOR_TYPES[img.mode], 0, 0, 0)
    chunks = [_chunk(b"IHDR", header)]
    if palette:
        chunks.append(_chunk(b"PLTE", palette))
    chunks += [_chunk(b"IDAT", isal_zlib.compress(rows, 1)), _chunk(b"IEND", b"")]
    return _PNG_SIGNATURE + b"".join(chunks)


def _chunk(kind: bytes, body: bytes) -> bytes:
    """One PNG chunk: length, type, body, CRC-32 of type and body."""
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def decode_image(
    data_url: str,
    *,
    max_bytes: int = DEFAULT_MAX_IMAGE_BYTES,
    max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
) -> Image.Image:
    """Decode a PNG/JPEG/WebP data URL (or bare base64) into a loaded PIL image, enforcing both limits.

    Raises `ImageError` (a `ValueError`) with a message saying which check failed.
    """
    payload = _base64_payload(data_url)
    max_b64_chars = 4 * -(-max_bytes // 3)
    if len(payload) > max_b64_chars:
        raise ImageError(
            f"image payload too large: about {len(payload) * 3 // 4} bytes, limit is {max_bytes} bytes"
        )
    try:
        raw = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ImageError(f"invalid base64 in image payload: {exc}") from None
    if len(raw) > max_bytes:
        raise ImageError(f"image payload too large: {len(raw)} bytes, limit is {max_bytes} bytes")
    return _open_checked(raw, max_pixels)


def _base64_payload(data_url: str) -> str:
    """The base64 part of a `data:<image type>;base64,<payload>` URL; other strings are bare base64."""
    if not isinstance(data_url, str):
        raise ImageError(f"image must be a data URL string, got {type(data_url).__name__}")
    text = data_url.strip()
    if text.lower().startswith(("http://", "https://")):
        raise ImageError(
            "image URLs are not fetched; send the image as a data URL (data:image/png;base64,...)"
        )
    if not text.startswith("data:"):
        return text
    header, sep, payload = text.partition(",")
    if not sep:
        raise ImageError("malformed data URL: no ',' between header and payload")
    params = header[len("data:") :].split(";")
    media_type = params[0].strip().lower()
    if media_type not in _MEDIA_TYPES:
        allowed = ", ".join(sorted(_MEDIA_TYPES))
        raise ImageError(f"unsupported media type {media_type or '(none)'!r} in data URL; expected {allowed}")
    if params[-1].strip().lower() != "base64":
        raise ImageError("data URL is not base64-encoded (missing ';base64')")
    return payload


def _open_checked(raw: bytes, max_pixels: int) -> Image.Image:
    """Open `raw` as PNG/JPEG/WebP, check the header's size against `max_pixels`, then decode the pixels."""
    try:
        img = Image.open(io.BytesIO(raw), formats=_FORMATS)
    except Image.DecompressionBombError as exc:
        raise ImageError(f"image too large: {exc}") from None
    except UnidentifiedImageError:  # PIL's message names the buffer object, not the problem
        raise ImageError("payload is not a PNG, JPEG or WebP image") from None
    except (OSError, SyntaxError, ValueError) as exc:
        raise ImageError(f"payload is not a PNG, JPEG or WebP image: {exc}") from None
    width, height = img.size
    if width * height > max_pixels:
        pixels = width * height
        raise ImageError(f"image too large: {width}x{height} = {pixels} pixels, limit is {max_pixels}")
    try:
        img.load()
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        raise ImageError(f"corrupt or truncated {img.format} image: {exc}") from None
    return img
