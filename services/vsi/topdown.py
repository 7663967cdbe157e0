"""A top-down map of a room for people: walls, the 1 m grid, object footprints with their categories, and
camera poses (the tour's numbered stops, the start pose) as arrows."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
from PIL import Image, ImageDraw

from vistarl.services.vsi.camera import Pose
from vistarl.services.vsi.geometry import Array
from vistarl.services.vsi.render import CEILING_COLOR, FLOOR_COLOR, category_color, label_font
from vistarl.services.vsi.scenes import Scene

MARGIN = 24
ToPixel = Callable[[float, float], tuple[float, float]]


def top_down_map(
    scene: Scene, size: int = 640, tour: Sequence[Pose] = (), start: Pose | None = None
) -> Image.Image:
    """The room seen from above, turned so its walls are square with the picture, scaled to fit
    `size`×`size` pixels."""
    x0, y0, x1, y1 = scene.extent
    scale = (size - 2 * MARGIN) / max(x1 - x0, y1 - y0)

    def room_pixel(rx: float, ry: float) -> tuple[float, float]:
        return MARGIN + (rx - x0) * scale, size - MARGIN - (ry - y0) * scale

    def to_pixel(x: float, y: float) -> tuple[float, float]:
        rx, ry = scene.to_room(np.array([[x, y]]))[0]
        return room_pixel(float(rx), float(ry))

    image = Image.new("RGB", (size, size), _rgb(CEILING_COLOR))
    draw = ImageDraw.Draw(image)
    draw.rectangle(
        (*room_pixel(x0, y1), *room_pixel(x1, y0)), fill=_rgb(FLOOR_COLOR), outline=(60, 60, 60), width=3
    )
    for gx in range(math.ceil(x0), math.floor(x1) + 1):
        draw.line((*room_pixel(gx, y0), *room_pixel(gx, y1)), fill=(120, 110, 100))
    for gy in range(math.ceil(y0), math.floor(y1) + 1):
        draw.line((*room_pixel(x0, gy), *room_pixel(x1, gy)), fill=(120, 110, 100))
    font = label_font(max(9, size // 50))
    for obj in sorted(scene.objects, key=lambda o: o.box.top):
        outline = [to_pixel(float(x), float(y)) for x, y in convex_hull(obj.box.corners[:, :2])]
        draw.polygon(outline, fill=_rgb(category_color(obj.category)), outline=(30, 30, 30))
    for obj in scene.objects:
        draw.text(to_pixel(*obj.box.center[:2]), obj.category, fill=(0, 0, 0), font=font, anchor="mm")
    for number, pose in enumerate(tour, start=1):
        _arrow(draw, to_pixel, pose, scale, (40, 90, 200))
        draw.text(to_pixel(pose.x, pose.y), str(number), fill=(255, 255, 255), font=font, anchor="mm")
    if start is not None:
        _arrow(draw, to_pixel, start, scale, (210, 40, 40))
    return image


def convex_hull(points: Array) -> list[tuple[float, float]]:
    """The convex hull of 2D points, counter-clockwise (Andrew's monotone chain)."""
    ordered = sorted({(float(x), float(y)) for x, y in points})
    if len(ordered) <= 2:
        return ordered

    def half(chain: list[tuple[float, float]]) -> list[tuple[float, float]]:
        hull: list[tuple[float, float]] = []
        for p in chain:
            while len(hull) >= 2 and _turn(hull[-2], hull[-1], p) <= 0:
                hull.pop()
            hull.append(p)
        return hull[:-1]

    return half(ordered) + half(ordered[::-1])


def _turn(a: tuple[float, float], b: tuple[float, float], c: tuple[float, float]) -> float:
    return (b[0] - a[0]) * (c[1] - a[1]) - (b[1] - a[1]) * (c[0] - a[0])


def _arrow(
    draw: ImageDraw.ImageDraw, to_pixel: ToPixel, pose: Pose, scale: float, color: tuple[int, int, int]
) -> None:
    """A dot at the pose and a line 0.6 m along its heading."""
    x, y = to_pixel(pose.x, pose.y)
    yaw = math.radians(pose.yaw)
    tip = to_pixel(pose.x + 0.6 * math.cos(yaw), pose.y + 0.6 * math.sin(yaw))
    radius = max(6, scale * 0.15)
    draw.line((x, y, *tip), fill=color, width=3)
    draw.ellipse((x - radius, y - radius, x + radius, y + radius), fill=color)


def _rgb(color: tuple[float, float, float]) -> tuple[int, int, int]:
    r, g, b = (round(255 * c) for c in color)
    return r, g, b
