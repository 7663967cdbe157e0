"""Small hand-made VSI rooms for tests: axis-aligned boxes at chosen places."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence

import numpy as np

from vistarl.services.vsi.geometry import Box
from vistarl.services.vsi.scenes import Scene, SceneObject

_names = itertools.count()


def box(center: Sequence[float], lengths: Sequence[float]) -> Box:
    """An axis-aligned box."""
    return Box(
        center=np.asarray(center, dtype=float), axes=np.eye(3), lengths=np.asarray(lengths, dtype=float)
    )


def make_scene(
    objects: Sequence[tuple[str, Box]], room_size: float, center: Sequence[float] = (0, 0, 1)
) -> Scene:
    """A room of the given objects; counts are the boxes' counts, the name unique to this process."""
    return Scene(
        name=f"test-room-{next(_names)}",
        dataset="synthetic",
        room_size=room_size,
        room_center=np.asarray(center, dtype=float),
        object_counts=dict(Counter(category for category, _ in objects)),
        objects=tuple(SceneObject(category, b) for category, b in objects),
    )
