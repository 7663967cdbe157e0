"""Training rooms: rectangles furnished from the VSI-Bench layouts' statistics, never a VSI-Bench room.

A synthetic room `synth-N` is built from seed N alone: its floor area is a VSI-Bench room size, its
object count a VSI-Bench scene's, and each object copies a VSI-Bench instance's category, side lengths
and height above the floor (so categories and sizes follow the real frequencies), at a random place
and heading where it overlaps nothing placed before. Doors, windows, mirrors and whiteboards stand
against a wall. The real rooms stay the test split (`docs/vsi.md`).
"""

from __future__ import annotations

import functools
import math
import random
import re
from dataclasses import dataclass

import numpy as np

from vistarl.services.vsi.geometry import Box, boxes_overlap
from vistarl.services.vsi.scenes import Scene, SceneObject, load_vsibench

SYNTH_PREFIX = "synth-"
SYNTH_DATASET = "synthetic"
WALL_CATEGORIES = frozenset({"door", "window", "mirror", "whiteboard"})
MAX_OBJECTS = 40
PLACEMENT_TRIES = 30
WALL_HEIGHT = 2.6
_NAME = re.compile(rf"^{SYNTH_PREFIX}(\d{{1,10}})$")


@dataclass(frozen=True)
class _Template:
    """What a synthetic object copies from a real instance."""

    category: str
    footprint: tuple[float, float]
    """Horizontal sides, thinner first (a wall object's thin side faces the room)."""
    height: float
    elevation: float


@dataclass(frozen=True)
class _Statistics:
    """What synthetic rooms draw from: real room sizes, object counts per room, and instances."""

    room_sizes: tuple[float, ...]
    object_counts: tuple[int, ...]
    templates: tuple[_Template, ...]


def synth_name(seed: int) -> str:
    """The name of the synthetic room built from `seed`."""
    return f"{SYNTH_PREFIX}{seed}"


def synth_seed(name: str) -> int | None:
    """The seed a synthetic room's name encodes, or None for any other name."""
    match = _NAME.match(name)
    return int(match.group(1)) if match else None


@functools.lru_cache(maxsize=1024)
def synth_scene(seed: int) -> Scene:
    """The synthetic room of `seed` (the same room for the same seed, in every process)."""
    rng = random.Random(f"vsi-synth/{seed}")
    stats = _statistics()
    area = rng.choice(stats.room_sizes)
    aspect = rng.uniform(1.0, 1.8)
    width, depth = math.sqrt(area * aspect), math.sqrt(area / aspect)
    count = min(MAX_OBJECTS, rng.choice(stats.object_counts))
    placed: list[SceneObject] = []
    for _ in range(count):
        template = rng.choice(stats.templates)
        box = _place(template, width, depth, placed, rng)
        if box is not None:
            placed.append(SceneObject(template.category, box))
    if not placed:
        placed.append(SceneObject(stats.templates[0].category, _box(stats.templates[0], 0.0, 0.0, 0.0)))
    counts: dict[str, int] = {}
    for obj in placed:
        counts[obj.category] = counts.get(obj.category, 0) + 1
    return Scene(
        name=synth_name(seed),
        dataset=SYNTH_DATASET,
        room_size=round(width * depth, 6),
        room_center=np.array([0.0, 0.0, WALL_HEIGHT / 2]),
        object_counts=counts,
        objects=tuple(placed),
    )


def _place(
    template: _Template, width: float, depth: float, placed: list[SceneObject], rng: random.Random
) -> Box | None:
    """A box for `template` inside the room, overlapping no placed box; None after `PLACEMENT_TRIES`."""
    half_w, half_d = width / 2, depth / 2
    for _ in range(PLACEMENT_TRIES):
        if template.category in WALL_CATEGORIES:
            heading = float(rng.choice((0, 90, 180, 270)))
            along, off = (half_d, half_w) if heading % 180 == 0 else (half_w, half_d)
            offset = off - template.footprint[0] / 2 - 0.01
            slide = rng.uniform(-along + template.footprint[1] / 2, along - template.footprint[1] / 2)
            angle = math.radians(heading)
            x = offset * math.cos(angle) - slide * math.sin(angle)
            y = offset * math.sin(angle) + slide * math.cos(angle)
        else:
            heading = rng.choice((0, 90, 180, 270)) + rng.gauss(0.0, 8.0)
            reach = max(template.footprint) / 2
            x = rng.uniform(-half_w + reach, half_w - reach) if half_w > reach else 0.0
            y = rng.uniform(-half_d + reach, half_d - reach) if half_d > reach else 0.0
        box = _box(template, x, y, heading)
        inside = np.all(np.abs(box.corners[:, :2]) <= (half_w, half_d))
        if inside and not any(boxes_overlap(box, other.box) for other in placed):
            return box
    return None


def _box(template: _Template, x: float, y: float, heading_deg: float) -> Box:
    """The template's box at (x, y), its first footprint side along `heading_deg`."""
    angle = math.radians(heading_deg)
    axes = np.array(
        [[math.cos(angle), math.sin(angle), 0.0], [-math.sin(angle), math.cos(angle), 0.0], [0, 0, 1]]
    )
    lengths = np.array([*template.footprint, template.height])
    center = np.array([x, y, template.elevation + template.height / 2])
    return Box(center=center, axes=axes, lengths=lengths)


@functools.cache
def _statistics() -> _Statistics:
    """Room sizes, object counts and object templates of every VSI-Bench scene."""
    scenes = sorted(load_vsibench().values(), key=lambda s: s.name)
    templates = []
    for scene in scenes:
        for obj in scene.objects:
            vertical = int(np.argmax(np.abs(obj.box.axes[:, 2])))
            sides = [float(obj.box.lengths[i]) for i in range(3) if i != vertical]
            height = float(obj.box.lengths[vertical])
            elevation = min(max(obj.box.bottom - scene.floor_z, 0.0), WALL_HEIGHT - height)
            thin, wide = sorted(sides)
            templates.append(_Template(obj.category, (thin, wide), height, max(elevation, 0.0)))
    return _Statistics(
        room_sizes=tuple(s.room_size for s in scenes),
        object_counts=tuple(len(s.objects) for s in scenes),
        templates=tuple(templates),
    )
