"""Angle sums of polygons: the interior sum, a regular polygon's interior or exterior angle, and the
missing angle of an irregular polygon."""

from __future__ import annotations

import math
import random

from vistarl.services.geo3k.generator.diagram import Diagram, Point
from vistarl.services.geo3k.generator.draft import (
    Draft,
    Template,
    centroid,
    degrees,
    point_names,
    polar,
    rational,
)

SIDES = (5, 6, 7, 8, 9, 10, 12)
POLYGON_NAMES = {
    5: "pentagon",
    6: "hexagon",
    7: "heptagon",
    8: "octagon",
    9: "nonagon",
    10: "decagon",
    12: "dodecagon",
}


def _regular(diagram: Diagram, n: int, turn: float) -> list[Point]:
    """Draw a regular n-gon with every side ticked; its vertices."""
    vertices = [polar(1.0, turn + 360 * k / n) for k in range(n)]
    diagram.polygon(vertices)
    for p, q in zip(vertices, [*vertices[1:], vertices[0]], strict=True):
        diagram.ticks(p, q)
    return vertices


def regular_interior_angle(rng: random.Random) -> Draft:
    """A regular polygon (sides ticked); find one interior angle."""
    n = rng.choice(SIDES)
    diagram = Diagram()
    vertices = _regular(diagram, n, rng.uniform(0, 360))
    diagram.angle(vertices[0], vertices[-1], vertices[1], degrees("x"))
    answer = rational(180 * (n - 2), n)
    wrong = (rational(360, n), rational(180 * (n - 2)), rational(180 * (n - 1), n))
    return Draft(
        f"The {POLYGON_NAMES[n]} is regular. Find x.", answer, wrong, diagram, f"regular_interior:{n}"
    )


def regular_exterior_angle(rng: random.Random) -> Draft:
    """A regular polygon with one side extended; find the exterior angle."""
    n = rng.choice(SIDES)
    diagram = Diagram()
    vertices = _regular(diagram, n, rng.uniform(0, 360))
    a, b = vertices[0], vertices[1]
    beyond = (b[0] + 0.6 * (b[0] - a[0]), b[1] + 0.6 * (b[1] - a[1]))
    diagram.segment(b, beyond)
    diagram.angle(b, beyond, vertices[2], degrees("x"))
    answer = rational(360, n)
    wrong = (rational(180 * (n - 2), n), rational(180, n), rational(360 * (n - 1), n))
    return Draft(
        f"The {POLYGON_NAMES[n]} is regular. Find x.", answer, wrong, diagram, f"regular_exterior:{n}"
    )


def _irregular(rng: random.Random, n: int) -> list[Point]:
    """A convex n-gon: points on a circle at jittered, well-spread angles."""
    step = 360 / n
    return [polar(1.0, k * step + rng.uniform(-0.3, 0.3) * step) for k in range(n)]


def interior_angle_sum(rng: random.Random) -> Draft:
    """An irregular convex polygon; find the sum of its interior angles."""
    n = rng.randint(4, 10)
    vertices = _irregular(rng, n)
    diagram = Diagram()
    diagram.polygon(vertices)
    diagram.point_names(zip(vertices, point_names(rng, n), strict=True), centroid(*vertices))
    answer = rational(180 * (n - 2))
    wrong = (rational(180 * n), rational(360), rational(180 * (n - 1)))
    statement = "Find the sum of the measures of the interior angles of the polygon."
    return Draft(statement, answer, wrong, diagram, f"interior_angle_sum:{n}")


def missing_polygon_angle(rng: random.Random) -> Draft:
    """An irregular convex polygon with all angles but one labelled; find the last."""
    n = rng.randint(4, 6)
    vertices = _irregular(rng, n)
    measured = [round(_interior(vertices, k)) for k in range(n)]
    asked = rng.randrange(n)
    known = [angle for k, angle in enumerate(measured) if k != asked]
    diagram = Diagram()
    diagram.polygon(vertices)
    for k in range(n):
        text = degrees("x") if k == asked else degrees(measured[k])
        diagram.angle(vertices[k], vertices[k - 1], vertices[(k + 1) % n], text)
    answer = rational(180 * (n - 2) - sum(known))
    wrong = (
        rational(360 - sum(known) % 360),
        rational(180 * (n - 1) - sum(known)),
        rational(180 * n - sum(known)),
    )
    return Draft(
        "Find x.", answer, wrong, diagram, f"missing_polygon_angle:{','.join(map(str, sorted(known)))}"
    )


def _interior(vertices: list[Point], k: int) -> float:
    """The interior angle (degrees) of a convex polygon at vertex k."""
    v, a, b = vertices[k], vertices[k - 1], vertices[(k + 1) % len(vertices)]
    first = math.atan2(a[1] - v[1], a[0] - v[0])
    second = math.atan2(b[1] - v[1], b[0] - v[0])
    angle = abs(math.degrees(first - second)) % 360
    return 360 - angle if angle > 180 else angle


TEMPLATES: tuple[Template, ...] = (
    regular_interior_angle,
    regular_exterior_angle,
    interior_angle_sum,
    missing_polygon_angle,
)
