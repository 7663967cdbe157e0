"""Labelled geometry diagrams drawn with PIL, in the black-on-white style of Geometry3K's figures.

A `Diagram` collects shapes in world coordinates (y up); `render` rotates them, fits them into a
square canvas with room for labels, and draws them. Marks and labels are placed in pixel space
(angle arcs of a fixed radius, labels pushed away from a reference point), so they stay readable
at any scale and rotation. The font is Pillow's built-in one: the same pixels on every machine.
Images are grayscale ("L"): black on white needs no colour, and the PNG encodes in about half the
time of RGB, at half the size (Qwen-VL processors convert to RGB themselves).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Sequence

from PIL import Image, ImageDraw, ImageFont

Point = tuple[float, float]

IMAGE_SIZE = 448
"""Pixels per side: a multiple of 28 and of 32, so Qwen2.5-VL and Qwen3-VL patches tile it exactly."""
MARGIN = 52
LINE_WIDTH = 3
FONT_SIZE = 22
LABEL_GAP = 18
ANGLE_RADIUS = 26
RIGHT_MARK = 14
MAX_LABEL_REACH = 100
INK = 0
PAPER = 255


@functools.cache
def _font() -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    return ImageFont.load_default(size=FONT_SIZE)


class Painter:
    """Draws on one canvas, mapping world points to pixels."""

    def __init__(self, image: Image.Image, to_px: Callable[[Point], Point]) -> None:
        self.draw = ImageDraw.Draw(image)
        self.to_px = to_px
        self.size = image.size[0]

    def segment(self, p: Point, q: Point, dashed: bool) -> None:
        a, b = self.to_px(p), self.to_px(q)
        if not dashed:
            self.draw.line([a, b], fill=INK, width=LINE_WIDTH)
            return
        length = math.dist(a, b)
        dashes = max(1, int(length // 10))
        for k in range(0, dashes, 2):
            s, e = k / dashes, min(1.0, (k + 1) / dashes)
            self.draw.line([_lerp(a, b, s), _lerp(a, b, e)], fill=INK, width=2)

    def circle(self, centre: Point, radius: float) -> None:
        c = self.to_px(centre)
        r = math.dist(c, self.to_px((centre[0] + radius, centre[1])))
        self.draw.ellipse([c[0] - r, c[1] - r, c[0] + r, c[1] + r], outline=INK, width=LINE_WIDTH)

    def dot(self, p: Point) -> None:
        x, y = self.to_px(p)
        self.draw.ellipse([x - 4, y - 4, x + 4, y + 4], fill=INK)

    def label(self, at: Point, text: str, away_from: Point | None) -> None:
        """`text` next to world point `at`, pushed away from `away_from` (centred on `at` if None)."""
        x, y = self.to_px(at)
        if away_from is not None:
            ux, uy = _unit(_sub((x, y), self.to_px(away_from)))
            x, y = x + ux * LABEL_GAP, y + uy * LABEL_GAP
        self.text((x, y), text)

    def side_label(self, p: Point, q: Point, text: str, away_from: Point) -> None:
        """`text` beside the middle of segment pq, on the side away from `away_from`."""
        a, b = self.to_px(p), self.to_px(q)
        mid = _lerp(a, b, 0.5)
        nx, ny = _unit((a[1] - b[1], b[0] - a[0]))
        far = self.to_px(away_from)
        if (far[0] - mid[0]) * nx + (far[1] - mid[1]) * ny > 0:
            nx, ny = -nx, -ny
        self.text((mid[0] + nx * LABEL_GAP, mid[1] + ny * LABEL_GAP), text)

    def angle(self, vertex: Point, a: Point, b: Point, text: str | None, arcs: int) -> None:
        """Arc(s) inside angle a-vertex-b (the smaller side), and `text` along its bisector."""
        v = self.to_px(vertex)
        start, sweep = _angle_span(v, self.to_px(a), self.to_px(b))
        for k in range(arcs):
            r = ANGLE_RADIUS + 5 * k
            self.draw.arc([v[0] - r, v[1] - r, v[0] + r, v[1] + r], start, start + sweep, fill=INK, width=2)
        if text is not None:
            mid = math.radians(start + sweep / 2)
            half_width = _font().getlength(text) / 2 + 4
            clear_of_sides = half_width / max(math.sin(math.radians(sweep / 2)), 0.05)
            reach = min(max(ANGLE_RADIUS + 5 * arcs + LABEL_GAP, clear_of_sides), MAX_LABEL_REACH)
            self.text((v[0] + reach * math.cos(mid), v[1] + reach * math.sin(mid)), text)

    def right_angle(self, vertex: Point, a: Point, b: Point) -> None:
        v = self.to_px(vertex)
        ua, ub = _unit(_sub(self.to_px(a), v)), _unit(_sub(self.to_px(b), v))
        p1 = (v[0] + ua[0] * RIGHT_MARK, v[1] + ua[1] * RIGHT_MARK)
        p3 = (v[0] + ub[0] * RIGHT_MARK, v[1] + ub[1] * RIGHT_MARK)
        p2 = (p1[0] + ub[0] * RIGHT_MARK, p1[1] + ub[1] * RIGHT_MARK)
        self.draw.line([p1, p2, p3], fill=INK, width=2)

    def ticks(self, p: Point, q: Point, count: int) -> None:
        """`count` short strokes across the middle of pq: the mark of equal sides."""
        a, b = self.to_px(p), self.to_px(q)
        ux, uy = _unit(_sub(b, a))
        nx, ny = -uy, ux
        for k in range(count):
            cx, cy = _lerp(a, b, 0.5)
            cx, cy = cx + ux * 6 * (k - (count - 1) / 2), cy + uy * 6 * (k - (count - 1) / 2)
            self.draw.line([(cx - nx * 8, cy - ny * 8), (cx + nx * 8, cy + ny * 8)], fill=INK, width=2)

    def arrowheads(self, p: Point, q: Point, count: int) -> None:
        """`count` chevrons pointing from p to q near the middle of pq: the mark of parallel lines."""
        a, b = self.to_px(p), self.to_px(q)
        ux, uy = _unit(_sub(b, a))
        nx, ny = -uy, ux
        for k in range(count):
            tip = _lerp(a, b, 0.35)
            tip = (tip[0] + ux * 9 * k, tip[1] + uy * 9 * k)
            back = (tip[0] - ux * 10, tip[1] - uy * 10)
            wing1 = (back[0] + nx * 7, back[1] + ny * 7)
            wing2 = (back[0] - nx * 7, back[1] - ny * 7)
            self.draw.line([wing1, tip, wing2], fill=INK, width=2)

    def text(self, at: Point, text: str) -> None:
        """`text` centred at pixel `at`, kept inside the canvas."""
        lo, hi = MARGIN / 2, self.size - MARGIN / 2
        x, y = min(max(at[0], lo), hi), min(max(at[1], lo), hi)
        self.draw.text((x, y), text, fill=INK, font=_font(), anchor="mm")


Shape = Callable[[Painter], None]


class Diagram:
    """Shapes and labels in world coordinates, drawn by `render`."""

    def __init__(self) -> None:
        self._shapes: list[Shape] = []
        self._extent: list[Point] = []

    def segment(self, p: Point, q: Point, dashed: bool = False) -> None:
        self._extent += [p, q]
        self._shapes.append(lambda painter: painter.segment(p, q, dashed))

    def polygon(self, points: Sequence[Point]) -> None:
        for p, q in zip(points, [*points[1:], points[0]], strict=True):
            self.segment(p, q)

    def circle(self, centre: Point, radius: float) -> None:
        x, y = centre
        self._extent += [(x - radius, y - radius), (x + radius, y + radius)]
        self._shapes.append(lambda painter: painter.circle(centre, radius))

    def dot(self, p: Point) -> None:
        self._extent.append(p)
        self._shapes.append(lambda painter: painter.dot(p))

    def label(self, at: Point, text: str, away_from: Point | None = None) -> None:
        self._shapes.append(lambda painter: painter.label(at, text, away_from))

    def point_names(self, names: Iterable[tuple[Point, str]], away_from: Point) -> None:
        for point, name in names:
            self.label(point, name, away_from)

    def side_label(self, p: Point, q: Point, text: str, away_from: Point) -> None:
        self._shapes.append(lambda painter: painter.side_label(p, q, text, away_from))

    def angle(self, vertex: Point, a: Point, b: Point, text: str | None = None, arcs: int = 1) -> None:
        self._shapes.append(lambda painter: painter.angle(vertex, a, b, text, arcs))

    def right_angle(self, vertex: Point, a: Point, b: Point) -> None:
        self._shapes.append(lambda painter: painter.right_angle(vertex, a, b))

    def ticks(self, p: Point, q: Point, count: int = 1) -> None:
        self._shapes.append(lambda painter: painter.ticks(p, q, count))

    def arrowheads(self, p: Point, q: Point, count: int = 1) -> None:
        self._shapes.append(lambda painter: painter.arrowheads(p, q, count))

    def render(self, rotation_deg: float = 0.0, size: int = IMAGE_SIZE) -> Image.Image:
        """The diagram turned by `rotation_deg` and fitted into a `size` x `size` grayscale image."""
        if not self._extent:
            raise ValueError("an empty diagram cannot be drawn")
        turn = math.radians(rotation_deg)
        cos, sin = math.cos(turn), math.sin(turn)

        def rotate(p: Point) -> Point:
            return (p[0] * cos - p[1] * sin, p[0] * sin + p[1] * cos)

        turned = [rotate(p) for p in self._extent]
        xs, ys = [p[0] for p in turned], [p[1] for p in turned]
        span = max(max(xs) - min(xs), max(ys) - min(ys), 1e-9)
        scale = (size - 2 * MARGIN) / span
        cx, cy = (max(xs) + min(xs)) / 2, (max(ys) + min(ys)) / 2

        def to_px(p: Point) -> Point:
            x, y = rotate(p)
            return (size / 2 + (x - cx) * scale, size / 2 - (y - cy) * scale)

        image = Image.new("L", (size, size), PAPER)
        painter = Painter(image, to_px)
        for shape in self._shapes:
            shape(painter)
        return image


def _sub(a: Point, b: Point) -> Point:
    return (a[0] - b[0], a[1] - b[1])


def _unit(v: Point) -> Point:
    norm = math.hypot(*v) or 1.0
    return (v[0] / norm, v[1] / norm)


def _lerp(a: Point, b: Point, t: float) -> Point:
    return (a[0] + (b[0] - a[0]) * t, a[1] + (b[1] - a[1]) * t)


def _angle_span(v: Point, a: Point, b: Point) -> tuple[float, float]:
    """(start, sweep) in PIL's degrees (clockwise on screen) of the smaller angle between va and vb."""
    angle_a = math.degrees(math.atan2(a[1] - v[1], a[0] - v[0]))
    angle_b = math.degrees(math.atan2(b[1] - v[1], b[0] - v[0]))
    sweep = (angle_b - angle_a) % 360
    return (angle_a, sweep) if sweep <= 180 else (angle_b, 360 - sweep)
