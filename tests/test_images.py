"""The image codec: exact round trips, accepted encodings, and a clear `ImageError` for every bad payload."""

from __future__ import annotations

import base64
import io
import re
import struct
import zlib
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from PIL import Image

from vistarl.clients.images import ImageError, decode_image, encode_image


def _image(mode: str = "RGB", size: tuple[int, int] = (24, 16)) -> Image.Image:
    """A deterministic image with distinct pixel values, so a lossy or shifted decode is caught."""
    rng = np.random.default_rng(0)
    bands = len(Image.new(mode, (1, 1)).getbands())
    data = rng.integers(0, 256, size=(size[1], size[0], bands), dtype=np.uint8)
    return Image.fromarray(data.squeeze(-1) if bands == 1 else data, mode=mode)


def _file_bytes(img: Image.Image, fmt: str) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue()


def _data_url(raw: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64," + base64.b64encode(raw).decode()


def _png_claiming_size(width: int, height: int) -> bytes:
    """A PNG whose header claims `width`x`height` but whose pixel data is a few bytes (a 'bomb' header)."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(b"\0" * 64))
        + chunk(b"IEND", b"")
    )


def _palette_image(colors: int, size: tuple[int, int] = (24, 16)) -> Image.Image:
    """A P image using every index of a palette of `colors` distinct colours."""
    indices = (np.arange(size[0] * size[1]) % colors).astype(np.uint8).reshape(size[1], size[0])
    img = Image.fromarray(indices, mode="P")
    img.putpalette(bytes(np.random.default_rng(1).integers(0, 256, 3 * colors, dtype=np.uint8)))
    return img


def _png_file(url: str) -> Image.Image:
    """The PNG behind a data URL, its chunks' checksums verified."""
    raw = base64.b64decode(url.split(",", 1)[1])
    Image.open(io.BytesIO(raw)).verify()  # CRCs and structure
    return Image.open(io.BytesIO(raw))


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "L", "LA"])
def test_round_trip_is_pixel_exact(mode: str) -> None:
    img = _image(mode)
    url = encode_image(img)
    assert url.startswith("data:image/png;base64,")
    assert _png_file(url).mode == mode
    out = decode_image(url)
    assert out.mode == mode
    assert out.size == img.size
    assert out.tobytes() == img.tobytes()


@pytest.mark.parametrize(("colors", "bits"), [(1, 1), (2, 1), (3, 2), (10, 4), (16, 4), (17, 8), (256, 8)])
def test_palette_images_keep_their_indices_and_palette(colors: int, bits: int) -> None:
    img = _palette_image(colors, size=(23, 16))
    url = encode_image(img)
    assert _png_file(url).mode == "P"
    assert base64.b64decode(url.split(",", 1)[1])[24] == bits  # IHDR bit depth: the fewest that hold it
    out = decode_image(url)
    assert out.mode == "P"
    assert out.tobytes() == img.tobytes()
    assert out.getpalette() == img.getpalette()
    assert out.convert("RGB").tobytes() == img.convert("RGB").tobytes()


@pytest.mark.parametrize(
    "make",
    [
        lambda: _image("RGB").convert("1"),
        lambda: _image("L").convert("I;16"),
        lambda: _with_transparency(_palette_image(10)),
        lambda: _with_transparency(_image("RGB")),
        lambda: _image("RGB").convert("P", palette=Image.Palette.ADAPTIVE).convert("PA").convert("P"),
    ],
    ids=["1-bit", "16-bit", "palette with transparency", "RGB with transparency", "palette from PA"],
)
def test_images_the_fast_writer_leaves_to_pillow_round_trip(make: Any) -> None:
    img = make()
    out = decode_image(encode_image(img))
    assert out.mode == img.mode
    assert out.tobytes() == img.tobytes()
    assert out.info.get("transparency") == img.info.get("transparency")


def _with_transparency(img: Image.Image) -> Image.Image:
    img.info["transparency"] = 3 if img.mode == "P" else (1, 2, 3)
    return img


def test_encode_converts_modes_png_cannot_hold() -> None:
    cmyk = _image("RGB").convert("CMYK")
    out = decode_image(encode_image(cmyk))
    assert out.mode == "RGB"
    assert out.tobytes() == cmyk.convert("RGB").tobytes()


@settings(max_examples=25, deadline=None)
@given(arrays(np.uint8, st.tuples(st.integers(1, 12), st.integers(1, 12), st.just(3))))
def test_round_trip_property(pixels: np.ndarray) -> None:
    img = Image.fromarray(pixels, mode="RGB")
    assert np.array_equal(np.asarray(decode_image(encode_image(img))), pixels)


@settings(max_examples=50, deadline=None)
@given(st.data(), st.integers(1, 256))
def test_palette_round_trip_property(data: st.DataObject, colors: int) -> None:
    shape = st.tuples(st.integers(1, 12), st.integers(1, 12))  # odd widths: rows end in a partial byte
    indices = data.draw(arrays(np.uint8, shape, elements=st.integers(0, colors - 1)))
    img = Image.fromarray(indices, mode="P")
    img.putpalette(bytes(range(3 * colors)) if colors <= 85 else bytes(3 * colors))
    out = decode_image(encode_image(img))
    assert np.array_equal(np.asarray(out), indices)
    assert out.getpalette() == img.getpalette()


def test_bare_base64_is_accepted() -> None:
    img = _image()
    bare = encode_image(img).split(",", 1)[1]
    assert decode_image(bare).tobytes() == img.tobytes()


@pytest.mark.parametrize(("fmt", "media_type"), [("JPEG", "image/jpeg"), ("WEBP", "image/webp")])
def test_jpeg_and_webp_data_urls_decode(fmt: str, media_type: str) -> None:
    img = _image()
    out = decode_image(_data_url(_file_bytes(img, fmt), media_type))
    assert out.format == fmt
    assert out.size == img.size


@pytest.mark.parametrize(
    ("payload", "fragment"),
    [
        ("data:text/plain;base64,aGVsbG8=", "unsupported media type 'text/plain'"),
        ("data:image/gif;base64,R0lGODlh", "unsupported media type 'image/gif'"),
        ("data:;base64,aGVsbG8=", "unsupported media type '(none)'"),
        ("data:image/png;base64", "no ','"),
        ("data:image/png,rawbytes", "missing ';base64'"),
        ("data:image/png;base64,not base64!!", "invalid base64"),
        ("data:image/png;base64,abc", "invalid base64"),
        ("aGVsbG8gd29ybGQ=", "not a PNG, JPEG or WebP image"),
    ],
)
def test_malformed_payloads_raise_image_error(payload: str, fragment: str) -> None:
    with pytest.raises(ImageError, match=re.escape(fragment)):
        decode_image(payload)


def test_image_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        decode_image("data:text/plain;base64,aGVsbG8=")


def test_non_string_input_raises_image_error() -> None:
    with pytest.raises(ImageError, match="got bytes"):
        decode_image(b"data:image/png;base64,AAAA")  # type: ignore[arg-type]


def test_other_image_formats_are_refused_even_with_a_png_media_type() -> None:
    gif = _file_bytes(_image().convert("P"), "GIF")
    with pytest.raises(ImageError, match="not a PNG, JPEG or WebP image"):
        decode_image(_data_url(gif))


def test_truncated_image_raises_image_error() -> None:
    png = _file_bytes(_image(size=(64, 64)), "PNG")
    with pytest.raises(ImageError, match="corrupt or truncated PNG"):
        decode_image(_data_url(png[: len(png) // 2]))


def test_byte_limit_is_checked_before_base64_decoding() -> None:
    oversized_garbage = "data:image/png;base64," + "!" * 4000
    with pytest.raises(ImageError, match=r"too large.*limit is 1000 bytes"):
        decode_image(oversized_garbage, max_bytes=1000)


def test_byte_limit_admits_a_payload_of_exactly_the_limit() -> None:
    url = encode_image(_image())
    size = len(base64.b64decode(url.split(",", 1)[1]))
    assert decode_image(url, max_bytes=size).size == (24, 16)
    with pytest.raises(ImageError, match="too large"):
        decode_image(url, max_bytes=size - 1)


def test_pixel_limit_is_checked_from_the_header_before_decoding() -> None:
    bomb = _data_url(_png_claiming_size(5000, 5000))
    with pytest.raises(ImageError, match="5000x5000 = 25000000 pixels, limit is 16777216"):
        decode_image(bomb)


def test_pixel_limit_is_configurable() -> None:
    url = encode_image(_image(size=(24, 16)))
    assert decode_image(url, max_pixels=24 * 16).size == (24, 16)
    with pytest.raises(ImageError, match="24x16 = 384 pixels, limit is 383"):
        decode_image(url, max_pixels=383)


def test_decompression_bomb_is_refused_even_with_a_huge_pixel_limit() -> None:
    bomb = _data_url(_png_claiming_size(60_000, 60_000))
    with pytest.raises(ImageError, match="too large"):
        decode_image(bomb, max_pixels=10**12)
