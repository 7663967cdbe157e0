"""Rooms as the env sees them: objects as oriented boxes with categories, a floor, and four walls.

`load_vsibench()` reads the vendored VSI-Bench layouts (`data/README.md`). The walls enclose the room's
extent: the rectangle, turned to the objects' dominant heading, that holds every object's footprint and
the room centre, grown evenly on all sides to the layout's `room_size` when the objects span less floor
than that, so the drawn floor has the area room-size questions ask for; otherwise they hold the objects
with `WALL_MARGIN` to spare, and a room drawn more than `ROOM_SIZE_TOLERANCE` larger than its
`room_size` gets no room-size question (`docs/vsi.md`).
"""

from __future__ import annotations

import functools
import json
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

import numpy as np

from vistarl.services.vsi.geometry import Array, Box

VSIBENCH_FILES = {
    "arkitscenes": "arkitscenes_meta_info_val.json",
    "scannet": "scannet_meta_info_val.json",
    "scannetpp": "scannetpp_meta_info_val.json",
}
WALL_MARGIN = 0.05
"""Metres between the outermost object and a wall, where the objects span more than `room_size`."""
ROOM_SIZE_TOLERANCE = 0.05
"""How much larger than `room_size` the drawn floor may be for the room to keep room-size questions: within
it an exact measurement of the drawn floor still scores full marks (MRA's strictest threshold is 0.95)."""
MIN_WALL_HEIGHT = 2.5


class SceneError(ValueError):
    """A layout that cannot be used, or a scene name that names none."""


@dataclass(frozen=True, eq=False)
class SceneObject:
    """One object instance: its category and its box."""

    category: str
    box: Box


@dataclass(frozen=True, eq=False)
class Scene:
    """A room: its name and source, the layout's room size, centre and counts, and its objects."""

    name: str
    dataset: str
    room_size: float
    room_center: Array
    object_counts: Mapping[str, int]
    objects: tuple[SceneObject, ...]

    @functools.cached_property
    def floor_z(self) -> float:
        """Floor height: the lowest point of any object."""
        return min(obj.box.bottom for obj in self.objects)

    @functools.cached_property
    def wall_height(self) -> float:
        """Wall height above the floor: the highest object's top, at least `MIN_WALL_HEIGHT`."""
        return max(MIN_WALL_HEIGHT, max(obj.box.top for obj in self.objects) - self.floor_z)

    @functools.cached_property
    def wall_yaw(self) -> float:
        """The walls' heading in degrees, in [0, 90): the objects' dominant heading modulo 90°, each object
        weighted by its footprint's perimeter (a mean on the circle of 4× the angle)."""
        total = np.zeros(2)
        for obj in self.objects:
            axes, lengths = obj.box.axes, obj.box.lengths
            horizontal = [i for i in np.argsort(np.abs(axes[:, 2]))[:2]]
            angle = 4 * math.atan2(axes[horizontal[0], 1], axes[horizontal[0], 0])
            total += float(lengths[horizontal].sum()) * np.array([math.cos(angle), math.sin(angle)])
        return math.degrees(math.atan2(total[1], total[0]) / 4) % 90.0

    def to_room(self, points: Array) -> Array:
        """World (x, y) points (N, 2) in the walls' frame (its x along `wall_yaw`)."""
        c, s = math.cos(math.radians(self.wall_yaw)), math.sin(math.radians(self.wall_yaw))
        return points @ np.array([[c, -s], [s, c]])

    def from_room(self, points: Array) -> Array:
        """Points (N, 2) in the walls' frame back in world (x, y)."""
        c, s = math.cos(math.radians(self.wall_yaw)), math.sin(math.radians(self.wall_yaw))
        return points @ np.array([[c, s], [-s, c]])

    @functools.cached_property
    def extent(self) -> tuple[float, float, float, float]:
        """The walls' rectangle (x0, y0, x1, y1) in the walls' frame (`to_room`): objects and centre, grown
        evenly to an area of exactly `room_size` if they span less, else by `WALL_MARGIN`."""
        points = np.concatenate(
            [obj.box.corners[:, :2] for obj in self.objects] + [self.room_center[None, :2]]
        )
        corners = self.to_room(points)
        (x0, y0), (x1, y1) = corners.min(axis=0), corners.max(axis=0)
        width, depth = x1 - x0, y1 - y0
        grow = WALL_MARGIN
        if width * depth < self.room_size:
            grow = (math.sqrt((width - depth) ** 2 + 4 * self.room_size) - width - depth) / 4
        return float(x0 - grow), float(y0 - grow), float(x1 + grow), float(y1 + grow)

    @property
    def floor_area(self) -> float:
        """The drawn floor's area in m², inside the walls."""
        x0, y0, x1, y1 = self.extent
        return (x1 - x0) * (y1 - y0)

    @property
    def floor_shows_room_size(self) -> bool:
        """Whether the drawn floor is within `ROOM_SIZE_TOLERANCE` of `room_size`, so that a room-size
        question is fair to an agent that measures what it sees."""
        return self.floor_area <= self.room_size * (1 + ROOM_SIZE_TOLERANCE)

    @property
    def center_xy(self) -> Array:
        """The middle of the walls' rectangle, in world (x, y)."""
        x0, y0, x1, y1 = self.extent
        return self.from_room(np.array([[(x0 + x1) / 2, (y0 + y1) / 2]]))[0]

    def wall_corners(self) -> Array:
        """The walls' four corners in world (x, y), counter-clockwise, (4, 2)."""
        x0, y0, x1, y1 = self.extent
        return self.from_room(np.array([(x0, y0), (x1, y0), (x1, y1), (x0, y1)]))

    @functools.cached_property
    def box_counts(self) -> Counter[str]:
        """Boxes per category (the layout's `object_counts` may differ where it was corrected by hand)."""
        return Counter(obj.category for obj in self.objects)

    @functools.cached_property
    def indices(self) -> Mapping[str, tuple[int, ...]]:
        """The positions in `objects` of each category's instances."""
        found: dict[str, list[int]] = {}
        for i, obj in enumerate(self.objects):
            found.setdefault(obj.category, []).append(i)
        return {category: tuple(positions) for category, positions in found.items()}

    def instances(self, category: str) -> list[SceneObject]:
        """The objects of one category."""
        return [self.objects[i] for i in self.indices.get(category, ())]

    def is_unique(self, category: str) -> bool:
        """Exactly one instance, by the layout's counts and by its boxes."""
        return self.object_counts.get(category) == 1 and self.box_counts[category] == 1

    @functools.cached_property
    def unique_categories(self) -> tuple[str, ...]:
        """The categories with exactly one instance, sorted."""
        return tuple(sorted(c for c in self.box_counts if self.is_unique(c)))

    @functools.cached_property
    def categories(self) -> tuple[str, ...]:
        """Every category with a box, sorted."""
        return tuple(sorted(self.box_counts))


def scene_from_layout(name: str, layout: Mapping[str, Any], dataset: str) -> Scene:
    """Build a scene from one layout entry; a `SceneError` names what is missing or malformed."""
    try:
        objects = tuple(
            SceneObject(category, _box(entry))
            for category, entries in layout["object_bbox"].items()
            for entry in entries
        )
        scene = Scene(
            name=name,
            dataset=dataset,
            room_size=float(layout["room_size"]),
            room_center=np.asarray(layout["room_center"], dtype=np.float64).reshape(3),
            object_counts={str(k): int(v) for k, v in layout["object_counts"].items()},
            objects=objects,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise SceneError(f"scene {name!r}: malformed layout ({type(exc).__name__}: {exc})") from None
    if not objects:
        raise SceneError(f"scene {name!r} has no objects")
    return scene


def _box(entry: Mapping[str, Any]) -> Box:
    """A layout's box entry: centroid, row-major normalizedAxes (row i = axis i), full axesLengths."""
    axes = np.asarray(entry["normalizedAxes"], dtype=np.float64).reshape(3, 3)
    axes = axes / np.linalg.norm(axes, axis=1, keepdims=True)
    return Box(
        center=np.asarray(entry["centroid"], dtype=np.float64).reshape(3),
        axes=axes,
        lengths=np.asarray(entry["axesLengths"], dtype=np.float64).reshape(3),
    )


@functools.cache
def load_vsibench() -> Mapping[str, Scene]:
    """Every vendored VSI-Bench scene by name (read once per process)."""
    scenes: dict[str, Scene] = {}
    for dataset, file_name in VSIBENCH_FILES.items():
        path = resources.files("vistarl.services.vsi") / "data" / file_name
        for name, layout in json.loads(path.read_text(encoding="utf-8")).items():
            scenes[name] = scene_from_layout(name, layout, dataset)
    return scenes


def vsibench_names() -> Sequence[str]:
    """The VSI-Bench scene names, sorted."""
    return sorted(load_vsibench())


def median_scene() -> Scene:
    """The VSI-Bench scene with the median number of objects (ties by name): the benchmarks' scene."""
    scenes = sorted(load_vsibench().values(), key=lambda s: (len(s.objects), s.name))
    return scenes[len(scenes) // 2]
