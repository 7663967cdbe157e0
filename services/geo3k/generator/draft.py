"""What a topic template makes (`Draft`), and the small helpers every template shares.

A template draws its numbers from the `random.Random` it is given and returns the question, the
exact answer (a sympy number), wrong answers a student could reach (for multiple choice), the
figure, and a `key`: the mathematical content alone (template and numbers, not names, layout or
rotation), which keeps the train and test splits apart (`services/geo3k/splits.py`).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

import sympy

from vistarl.services.geo3k.generator.diagram import Diagram, Point

POINT_LETTERS = "ABCDEFGHJKLMNPQRSTUVWXYZ"
"""Vertex names: the alphabet without I and O (O names circle centres)."""
PI_HINT = "Express your answer in terms of \\pi."
EXACT_HINT = "Give the exact value."


@dataclass(frozen=True)
class Draft:
    """One generated question before it is lettered and drawn."""

    statement: str
    answer: sympy.Expr
    distractors: tuple[sympy.Expr, ...]
    diagram: Diagram
    key: str
    rotation_deg: float = 0.0


Template = Callable[[random.Random], Draft]


def point_names(rng: random.Random, count: int) -> list[str]:
    """`count` distinct vertex names."""
    return rng.sample(POINT_LETTERS, count)


def degrees(value: int | sympy.Expr) -> str:
    """An angle label: `65°`."""
    return f"{value}°"


def linear(coefficient: int, constant: int) -> str:
    """`3x + 5`, `x - 10`, `2x`: a linear expression in x as a label."""
    term = "x" if coefficient == 1 else f"{coefficient}x"
    if constant == 0:
        return term
    return f"{term} {'+' if constant > 0 else '-'} {abs(constant)}"


def polar(radius: float, angle_deg: float, centre: Point = (0.0, 0.0)) -> Point:
    """The point at `radius` and `angle_deg` (counter-clockwise from +x) around `centre`."""
    angle = math.radians(angle_deg)
    return (centre[0] + radius * math.cos(angle), centre[1] + radius * math.sin(angle))


def centroid(*points: Point) -> Point:
    """The mean of `points`."""
    return (sum(p[0] for p in points) / len(points), sum(p[1] for p in points) / len(points))


def triangle(side: float, angle_a: float, angle_b: float) -> tuple[Point, Point, Point]:
    """Vertices A, B, C of the triangle with AB = `side` and the given angles at A and B (degrees)."""
    angle_c = 180.0 - angle_a - angle_b
    ac = side * math.sin(math.radians(angle_b)) / math.sin(math.radians(angle_c))
    return (0.0, 0.0), (side, 0.0), polar(ac, angle_a)


def draw_triangle(diagram: Diagram, vertices: tuple[Point, Point, Point], names: list[str]) -> Point:
    """Draw a named triangle; its centroid (where labels are pushed away from)."""
    diagram.polygon(vertices)
    middle = centroid(*vertices)
    diagram.point_names(zip(vertices, names, strict=False), middle)
    return middle


def right_triangle(
    rng: random.Random, legs: tuple[float, float], labels: tuple[str, str, str | None]
) -> Diagram:
    """A named right triangle with legs along the axes, its right angle marked; the labels go on the
    horizontal leg, the vertical leg and the hypotenuse (None: unlabelled)."""
    vertices = ((0.0, 0.0), (float(legs[0]), 0.0), (0.0, float(legs[1])))
    diagram = Diagram()
    middle = draw_triangle(diagram, vertices, point_names(rng, 3))
    diagram.right_angle(vertices[0], vertices[1], vertices[2])
    for (p, q), label in zip(((0, 1), (0, 2), (1, 2)), labels, strict=True):
        if label is not None:
            diagram.side_label(vertices[p], vertices[q], label, middle)
    return diagram


def sqrt(value: int) -> sympy.Expr:
    """The exact square root of an integer, simplified (`sqrt(12)` is `2*sqrt(3)`)."""
    return sympy.sqrt(sympy.Integer(value))


def rational(numerator: int, denominator: int = 1) -> sympy.Expr:
    """An exact fraction."""
    return sympy.Rational(numerator, denominator)


def hint_unless_integer(answer: sympy.Expr) -> str:
    """The hint to append for an answer that is not a whole number (" Give the exact value."), else ""."""
    return "" if answer.is_Integer else " " + EXACT_HINT


def rejection(rng: random.Random, draw: Callable[[random.Random], tuple[int, ...] | None]) -> tuple[int, ...]:
    """The first numbers `draw` accepts (it returns None to reject); deterministic for a seeded `rng`."""
    for _ in range(1000):
        numbers = draw(rng)
        if numbers is not None:
            return numbers
    raise RuntimeError("the template found no valid numbers in 1000 draws")
