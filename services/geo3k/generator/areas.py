"""Areas and perimeters: rectangles, parallelograms, trapezoids, triangles (base and height), and the
perimeter of a right triangle."""

from __future__ import annotations

import random

from vistarl.services.geo3k.generator.diagram import Diagram, Point
from vistarl.services.geo3k.generator.draft import (
    Draft,
    Template,
    centroid,
    hint_unless_integer,
    point_names,
    rational,
    right_triangle,
    sqrt,
)


def _named(diagram: Diagram, rng: random.Random, vertices: list[Point]) -> Point:
    """Draw a polygon with named vertices; its centroid."""
    diagram.polygon(vertices)
    middle = centroid(*vertices)
    diagram.point_names(zip(vertices, point_names(rng, len(vertices)), strict=True), middle)
    return middle


def _height(diagram: Diagram, top: Point, foot: Point, toward: Point, label: str, away_from: Point) -> None:
    """A dashed height from `top` down to `foot` (square at the foot, toward `toward`), labelled."""
    diagram.segment(top, foot, dashed=True)
    diagram.right_angle(foot, top, toward)
    diagram.side_label(top, foot, label, away_from)


def rectangle(rng: random.Random) -> Draft:
    """A rectangle with its sides labelled; find its area or perimeter."""
    w, h = rng.randint(2, 20), rng.randint(2, 20)
    ask_area = rng.random() < 0.5
    vertices = [(0.0, 0.0), (float(w), 0.0), (float(w), float(h)), (0.0, float(h))]
    diagram = Diagram()
    middle = _named(diagram, rng, vertices)
    for corner in range(4):
        diagram.right_angle(vertices[corner], vertices[corner - 1], vertices[(corner + 1) % 4])
    diagram.side_label(vertices[0], vertices[1], str(w), middle)
    diagram.side_label(vertices[1], vertices[2], str(h), middle)
    if ask_area:
        answer, wrong = rational(w * h), (rational(2 * (w + h)), rational(w + h), rational(w * h, 2))
    else:
        answer, wrong = rational(2 * (w + h)), (rational(w * h), rational(w + h), rational(4 * (w + h)))
    what = "area" if ask_area else "perimeter"
    key = f"rectangle_{what}:{min(w, h)},{max(w, h)}"
    return Draft(f"Find the {what} of the rectangle.", answer, wrong, diagram, key, rng.uniform(-15, 15))


def parallelogram_area(rng: random.Random) -> Draft:
    """A parallelogram with its base, slanted side and height labelled; find its area."""
    base, h, lean = rng.randint(5, 20), rng.randint(2, 12), rng.randint(1, 6)
    vertices = [(0.0, 0.0), (float(base), 0.0), (float(base + lean), float(h)), (float(lean), float(h))]
    side = sqrt(lean * lean + h * h)
    diagram = Diagram()
    middle = _named(diagram, rng, vertices)
    diagram.side_label(vertices[0], vertices[1], str(base), middle)
    slant = str(side) if side.is_Integer else f"{float(side):.1f}"
    diagram.side_label(vertices[0], vertices[3], slant, middle)
    _height(diagram, vertices[3], (float(lean), 0.0), vertices[1], str(h), vertices[0])
    answer = rational(base * h)
    wrong = (base * side, rational(base * h, 2), rational(2 * base + 2 * h))
    key = f"parallelogram_area:{base},{h},{lean}"
    return Draft("Find the area of the parallelogram.", answer, wrong, diagram, key, rng.uniform(-15, 15))


def trapezoid_area(rng: random.Random) -> Draft:
    """A trapezoid with both bases and the height labelled; find its area."""
    bottom, top, h = rng.randint(6, 20), rng.randint(2, 16), rng.randint(2, 12)
    offset = rng.uniform(-2.0, bottom - top + 2.0) if bottom > top else rng.uniform(-2.0, 2.0)
    vertices = [(0.0, 0.0), (float(bottom), 0.0), (offset + top, float(h)), (offset, float(h))]
    diagram = Diagram()
    middle = _named(diagram, rng, vertices)
    diagram.side_label(vertices[0], vertices[1], str(bottom), middle)
    diagram.side_label(vertices[3], vertices[2], str(top), middle)
    foot_x = min(max(offset + top / 4, 0.5), bottom - 0.5)
    _height(diagram, (foot_x, float(h)), (foot_x, 0.0), vertices[1], str(h), vertices[1])
    answer = rational((bottom + top) * h, 2)
    wrong = (rational((bottom + top) * h), rational(bottom * h), rational(bottom + top + 2 * h))
    key = f"trapezoid_area:{min(bottom, top)},{max(bottom, top)},{h}"
    return Draft("Find the area of the trapezoid.", answer, wrong, diagram, key, rng.uniform(-10, 10))


def triangle_area(rng: random.Random) -> Draft:
    """A triangle with a base and its height labelled; find its area."""
    base, h = rng.randint(3, 20), rng.randint(2, 16)
    apex_x = rng.uniform(0.15, 0.85) * base
    vertices = [(0.0, 0.0), (float(base), 0.0), (apex_x, float(h))]
    diagram = Diagram()
    middle = _named(diagram, rng, vertices)
    diagram.side_label(vertices[0], vertices[1], str(base), middle)
    _height(diagram, vertices[2], (apex_x, 0.0), vertices[1], str(h), vertices[0])
    answer = rational(base * h, 2)
    wrong = (rational(base * h), rational(base + h), rational(base * h, 4))
    return Draft(
        "Find the area of the triangle.",
        answer,
        wrong,
        diagram,
        f"triangle_area:{base},{h}",
        rng.uniform(-10, 10),
    )


def right_triangle_perimeter(rng: random.Random) -> Draft:
    """A right triangle with both legs labelled; find its perimeter."""
    a, b = rng.randint(2, 12), rng.randint(2, 12)
    diagram = right_triangle(rng, (a, b), (str(a), str(b), None))
    answer = a + b + sqrt(a * a + b * b)
    wrong = (rational(a + b), rational(2 * (a + b)), a + b + sqrt(abs(a * a - b * b)))
    statement = "Find the perimeter of the triangle." + hint_unless_integer(answer)
    key = f"right_triangle_perimeter:{min(a, b)},{max(a, b)}"
    return Draft(statement, answer, wrong, diagram, key, rng.uniform(0, 360))


TEMPLATES: tuple[Template, ...] = (
    rectangle,
    parallelogram_area,
    trapezoid_area,
    triangle_area,
    right_triangle_perimeter,
)
