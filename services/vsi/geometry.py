"""Oriented boxes in metres (z up) and the exact closest-point distance between two of them.

A box is a centre, three unit axes (the rows of `axes`) and full side lengths along them, as in the
VSI-Bench layouts (`docs/vsi.md`). Two disjoint convex boxes are closest at a vertex of one and the
other box, or at an edge of each; overlapping boxes are 0 apart (separating-axis test).
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

Array = NDArray[np.float64]

_SIGNS = np.array(list(itertools.product((-1.0, 1.0), repeat=3)))
"""Corner k of a box is centre + Σ_i _SIGNS[k, i] · half_i · axis_i."""
EDGES = np.array([(a, b) for a in range(8) for b in range(a + 1, 8) if bin(a ^ b).count("1") == 1])
"""The 12 edges as pairs of corner indices (corners that differ in one sign)."""
_EPS = 1e-9


@dataclass(frozen=True, eq=False)
class Box:
    """An oriented box: `center` (3,), `axes` (3, 3) with row i the unit axis i, full `lengths` (3,)."""

    center: Array
    axes: Array
    lengths: Array
    half: Array = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "half", self.lengths / 2.0)

    @functools.cached_property
    def corners(self) -> Array:
        """The 8 corners, (8, 3)."""
        return self.center + (_SIGNS * self.half) @ self.axes

    @property
    def bottom(self) -> float:
        """The lowest z of the box."""
        return float(self.corners[:, 2].min())

    @property
    def top(self) -> float:
        """The highest z of the box."""
        return float(self.corners[:, 2].max())

    def to_local(self, points: Array) -> Array:
        """World points (N, 3) in the box's frame (centre at 0, axes along x, y, z)."""
        return (points - self.center) @ self.axes.T

    def point_distances(self, points: Array) -> Array:
        """Distance from each point (N, 3) to the solid box: 0 inside."""
        outside = np.maximum(np.abs(self.to_local(points)) - self.half, 0.0)
        return np.sqrt((outside**2).sum(axis=1))


def box_distance(a: Box, b: Box) -> float:
    """The smallest distance between any point of box `a` and any point of box `b` (0 when they touch)."""
    if boxes_overlap(a, b):
        return 0.0
    vertex = min(a.point_distances(b.corners).min(), b.point_distances(a.corners).min())
    ea, eb = a.corners[EDGES], b.corners[EDGES]
    p0, p1 = np.repeat(ea[:, 0], 12, axis=0), np.repeat(ea[:, 1], 12, axis=0)
    q0, q1 = np.tile(eb[:, 0], (12, 1)), np.tile(eb[:, 1], (12, 1))
    return float(min(vertex, segment_distances(p0, p1, q0, q1).min()))


def boxes_overlap(a: Box, b: Box) -> bool:
    """Separating-axis test over the 15 candidate axes of two oriented boxes."""
    crosses = cross(np.repeat(a.axes, 3, axis=0), np.tile(b.axes, (3, 1)))
    norms = np.linalg.norm(crosses, axis=1)
    candidates = np.concatenate([a.axes, b.axes, crosses[norms > _EPS] / norms[norms > _EPS, None]])
    gap = np.abs(candidates @ (b.center - a.center))
    reach_a = np.abs(candidates @ a.axes.T) @ a.half
    reach_b = np.abs(candidates @ b.axes.T) @ b.half
    return bool(np.all(gap <= reach_a + reach_b + _EPS))


def segment_distances(p0: Array, p1: Array, q0: Array, q1: Array) -> Array:
    """Closest distance between segments p0–p1 and q0–q1, row by row ((N, 3) each)."""
    d1, d2, r = p1 - p0, q1 - q0, p0 - q0
    a = (d1 * d1).sum(axis=1)
    e = (d2 * d2).sum(axis=1)
    b = (d1 * d2).sum(axis=1)
    c = (d1 * r).sum(axis=1)
    f = (d2 * r).sum(axis=1)
    denom = a * e - b * b
    safe_a, safe_e = np.maximum(a, _EPS), np.maximum(e, _EPS)
    s = np.where(denom > _EPS, np.clip((b * f - c * e) / np.maximum(denom, _EPS), 0.0, 1.0), 0.0)
    t = (b * s + f) / safe_e
    s = np.where(
        t < 0.0, np.clip(-c / safe_a, 0.0, 1.0), np.where(t > 1.0, np.clip((b - c) / safe_a, 0, 1), s)
    )
    t = np.clip(t, 0.0, 1.0)
    gap = p0 + d1 * s[:, None] - (q0 + d2 * t[:, None])
    return np.sqrt((gap**2).sum(axis=1))


def cross(u: Array, v: Array) -> Array:
    """Row-wise cross products of (N, 3) arrays (`np.cross` costs several times more on small arrays)."""
    return np.stack(
        [
            u[:, 1] * v[:, 2] - u[:, 2] * v[:, 1],
            u[:, 2] * v[:, 0] - u[:, 0] * v[:, 2],
            u[:, 0] * v[:, 1] - u[:, 1] * v[:, 0],
        ],
        axis=1,
    )


def ccw_angle(forward: Array, vectors: Array) -> Array:
    """Counter-clockwise angle in degrees, in [0, 360), from the 2D `forward` to each 2D vector (N, 2)."""
    cross = forward[0] * vectors[:, 1] - forward[1] * vectors[:, 0]
    dot = vectors @ forward
    return np.degrees(np.arctan2(cross, dot)) % 360.0
