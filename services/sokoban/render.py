"""Drawing a Sokoban state as an image in the seed's colours, fast.

Each kind of cell is drawn once per cell size with PIL and kept as a numpy tile of palette indices; a
frame is one numpy gather of tiles by cell kind, so rendering costs a memory copy rather than a redraw.
Frames are palette ("P") images over the ten colours below: a palette PNG encodes several times faster
than an RGB one and is smaller, with identical pixels. `.convert("RGB")` gives RGB.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

import numpy as np
from PIL import Image, ImageDraw

from vistarl.services.sokoban.game import TARGET, WALL, Pos

FLOOR_TILE, WALL_TILE, TARGET_TILE, BOX_TILE, BOX_ON_TARGET_TILE, PLAYER_TILE, PLAYER_ON_TARGET_TILE = range(
    7
)

WALL_COLOR = (176, 80, 50)
FLOOR_COLOR = (8, 8, 8)
GRID_LINE_COLOR = (255, 255, 255)
TARGET_COLOR = (220, 40, 40)
DIAMOND_COLOR = (200, 30, 30)
BOX_COLOR = (233, 184, 47)
BOX_OUTLINE_COLOR = (180, 130, 20)
BOX_CROSS_COLOR = (196, 140, 24)
PLAYER_COLOR = (70, 200, 70)
EYE_COLOR = (0, 0, 0)

Color = tuple[int, int, int]

PALETTE: tuple[Color, ...] = (
    WALL_COLOR,
    FLOOR_COLOR,
    GRID_LINE_COLOR,
    TARGET_COLOR,
    DIAMOND_COLOR,
    BOX_COLOR,
    BOX_OUTLINE_COLOR,
    BOX_CROSS_COLOR,
    PLAYER_COLOR,
    EYE_COLOR,
)
_PALETTE_BYTES = bytes(channel for color in PALETTE for channel in color)


def render_image(
    grid: tuple[tuple[int, ...], ...], boxes: Iterable[Pos], player: Pos, cell_size: int = 64
) -> Image.Image:
    """Render a state as a palette image: `grid` of base codes, boxes, player; `cell_size` pixels per cell."""
    kinds = _base_kinds(grid).copy()
    for r, c in boxes:
        kinds[r, c] = BOX_ON_TARGET_TILE if kinds[r, c] == TARGET_TILE else BOX_TILE
    kinds[player] = PLAYER_ON_TARGET_TILE if kinds[player] == TARGET_TILE else PLAYER_TILE
    rows, cols = kinds.shape
    pixels = tiles(cell_size)[kinds].transpose(0, 2, 1, 3).reshape(rows * cell_size, cols * cell_size)
    image = Image.fromarray(pixels)
    image.putpalette(_PALETTE_BYTES)
    return image


@functools.lru_cache(maxsize=64)
def _base_kinds(grid: tuple[tuple[int, ...], ...]) -> np.ndarray:
    """The tile kind of each cell of a base grid (wall, floor or target), cached per level."""
    codes = np.array(grid, dtype=np.uint8)
    kinds = np.full(codes.shape, FLOOR_TILE, dtype=np.uint8)
    kinds[codes == WALL] = WALL_TILE
    kinds[codes == TARGET] = TARGET_TILE
    kinds.flags.writeable = False
    return kinds


@functools.lru_cache(maxsize=8)
def tiles(cell_size: int) -> np.ndarray:
    """All seven tiles at `cell_size` as palette indices: a read-only uint8 array (7, size, size)."""
    drawn = [
        _floor(cell_size),
        _solid(cell_size, WALL_COLOR),
        _target(cell_size),
        _with_box(_floor(cell_size), BOX_OUTLINE_COLOR),
        _with_box(_target(cell_size), TARGET_COLOR),
        _with_player(_floor(cell_size)),
        _with_player(_target(cell_size)),
    ]
    stack = np.stack([np.asarray(tile, dtype=np.uint8) for tile in drawn])
    stack.flags.writeable = False
    return stack


def _ink(color: Color) -> int:
    """The palette index of a colour (tiles are drawn in palette mode)."""
    return PALETTE.index(color)


def _solid(size: int, color: Color) -> Image.Image:
    return Image.new("P", (size, size), _ink(color))


def _floor(size: int) -> Image.Image:
    """Near-black floor with a thin grid line on its top and left edges (neighbours complete the grid)."""
    tile = _solid(size, FLOOR_COLOR)
    draw = ImageDraw.Draw(tile)
    draw.line([(0, 0), (size - 1, 0)], fill=_ink(GRID_LINE_COLOR))
    draw.line([(0, 0), (0, size - 1)], fill=_ink(GRID_LINE_COLOR))
    return tile


def _target(size: int) -> Image.Image:
    """Floor with a red outlined square and a red diamond in its centre."""
    tile = _floor(size)
    draw = ImageDraw.Draw(tile)
    pad = size // 4
    draw.rectangle(
        [pad, pad, size - 1 - pad, size - 1 - pad], outline=_ink(TARGET_COLOR), width=max(1, 3 * size // 64)
    )
    mid, radius = size // 2, size // 6
    draw.polygon(
        [(mid, mid - radius), (mid + radius, mid), (mid, mid + radius), (mid - radius, mid)],
        fill=_ink(DIAMOND_COLOR),
    )
    return tile


def _with_box(tile: Image.Image, outline: Color) -> Image.Image:
    """A yellow crate with an X; the outline is orange on floor and red on a target."""
    size = tile.width
    draw = ImageDraw.Draw(tile)
    inset = max(1, size // 16)
    lo, hi = inset, size - 1 - inset
    draw.rectangle(
        [lo, lo, hi, hi], fill=_ink(BOX_COLOR), outline=_ink(outline), width=max(1, 3 * size // 64)
    )
    cross = lo + max(1, 6 * size // 64)
    width = max(1, size // 16)
    draw.line([(cross, cross), (size - 1 - cross, size - 1 - cross)], fill=_ink(BOX_CROSS_COLOR), width=width)
    draw.line([(cross, size - 1 - cross), (size - 1 - cross, cross)], fill=_ink(BOX_CROSS_COLOR), width=width)
    return tile


def _with_player(tile: Image.Image) -> Image.Image:
    """A green figure: round head with two black eyes, a square body and two legs."""
    size = tile.width
    draw = ImageDraw.Draw(tile)
    mid = size // 2
    head = size // 6
    top = size // 8
    draw.ellipse([mid - head, top, mid + head, top + 2 * head], fill=_ink(PLAYER_COLOR))
    eye = max(1, size // 32)
    eye_y = top + head
    for eye_x in (mid - head // 2, mid + head // 2):
        draw.ellipse([eye_x - eye, eye_y - eye, eye_x + eye, eye_y + eye], fill=_ink(EYE_COLOR))
    body = size // 5
    body_top = top + 2 * head
    body_bottom = size - 1 - size // 4
    draw.rectangle([mid - body, body_top, mid + body, body_bottom], fill=_ink(PLAYER_COLOR))
    leg = max(1, size // 12)
    feet = size - 1 - size // 10
    draw.rectangle([mid - body, body_bottom, mid - body + leg, feet], fill=_ink(PLAYER_COLOR))
    draw.rectangle([mid + body - leg, body_bottom, mid + body, feet], fill=_ink(PLAYER_COLOR))
    return tile
