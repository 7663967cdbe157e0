"""Triangle questions: Pythagoras (either side), angle sums (numbers or linear expressions), the exterior
angle, isosceles base angles, and similar triangles."""

from __future__ import annotations

import random

from vistarl.services.geo3k.generator.diagram import Diagram
from vistarl.services.geo3k.generator.draft import (
    Draft,
    Template,
    degrees,
    draw_triangle,
    hint_unless_integer,
    linear,
    point_names,
    polar,
    rational,
    rejection,
    right_triangle,
    sqrt,
    triangle,
)


def pythagoras_hypotenuse(rng: random.Random) -> Draft:
    """Right triangle with both legs given; find the hypotenuse."""
    a, b = rng.randint(2, 15), rng.randint(2, 15)
    diagram = right_triangle(rng, (a, b), (str(a), str(b), "x"))
    answer = sqrt(a * a + b * b)
    wrong = (rational(a + b), sqrt(abs(a * a - b * b)), answer + 1, rational(a * b, 2))
    return Draft(
        "Find x." + hint_unless_integer(answer),
        answer,
        wrong,
        diagram,
        f"pythagoras_hypotenuse:{min(a, b)},{max(a, b)}",
        rng.uniform(0, 360),
    )


def pythagoras_leg(rng: random.Random) -> Draft:
    """Right triangle with the hypotenuse and one leg given; find the other leg."""
    a, c = rejection(rng, lambda r: _leg_and_hypotenuse(r.randint(2, 14), r.randint(3, 20)))
    diagram = right_triangle(rng, (a, (c * c - a * a) ** 0.5), (str(a), "x", str(c)))
    answer = sqrt(c * c - a * a)
    wrong = (sqrt(c * c + a * a), rational(c - a), rational(c + a), answer + 1)
    return Draft(
        "Find x." + hint_unless_integer(answer),
        answer,
        wrong,
        diagram,
        f"pythagoras_leg:{a},{c}",
        rng.uniform(0, 360),
    )


def _leg_and_hypotenuse(a: int, c: int) -> tuple[int, int] | None:
    return (a, c) if c > a else None


def angle_sum(rng: random.Random) -> Draft:
    """Two angles of a triangle given; find the third."""
    a, b = rejection(rng, lambda r: _two_angles(r.randint(20, 120), r.randint(20, 120)))
    vertices = triangle(10.0, a, b)
    diagram = Diagram()
    draw_triangle(diagram, vertices, point_names(rng, 3))
    diagram.angle(vertices[0], vertices[1], vertices[2], degrees(a))
    diagram.angle(vertices[1], vertices[2], vertices[0], degrees(b))
    diagram.angle(vertices[2], vertices[0], vertices[1], degrees("x"))
    answer = rational(180 - a - b)
    wrong = (rational(a + b), rational(360 - a - b), rational(90 - a) if a < 90 else rational(a - 90))
    return Draft("Find x.", answer, wrong, diagram, f"angle_sum:{a},{b}", rng.uniform(0, 360))


def _two_angles(a: int, b: int) -> tuple[int, int] | None:
    return (a, b) if 180 - a - b >= 20 else None


def angle_sum_algebra(rng: random.Random) -> Draft:
    """A triangle's angles as linear expressions in x (and one number); solve for x."""
    x, m1, q1, m2, q2, c = rejection(rng, _expression_angles)
    a, b = m1 * x + q1, m2 * x + q2
    vertices = triangle(10.0, a, b)
    diagram = Diagram()
    draw_triangle(diagram, vertices, point_names(rng, 3))
    diagram.angle(vertices[0], vertices[1], vertices[2], degrees(f"({linear(m1, q1)})"))
    diagram.angle(vertices[1], vertices[2], vertices[0], degrees(f"({linear(m2, q2)})"))
    diagram.angle(vertices[2], vertices[0], vertices[1], degrees(c))
    answer = rational(x)
    wrong = (rational(a), rational(b), rational(180 - c, m1 + m2))
    key = f"angle_sum_algebra:{m1},{q1},{m2},{q2},{c}"
    return Draft("Find x.", answer, wrong, diagram, key, rng.uniform(0, 360))


def _expression_angles(rng: random.Random) -> tuple[int, ...] | None:
    """(x, m1, q1, m2, q2, c): angles m1·x+q1 and m2·x+q2 and c (all 20° to 130°) summing to 180°."""
    x, m1, m2 = rng.randint(5, 30), rng.randint(1, 4), rng.randint(1, 4)
    q1, q2 = rng.randint(-20, 40), rng.randint(-20, 40)
    a, b = m1 * x + q1, m2 * x + q2
    c = 180 - a - b
    if all(20 <= angle <= 130 for angle in (a, b, c)):
        return (x, m1, q1, m2, q2, c)
    return None


def exterior_angle(rng: random.Random) -> Draft:
    """Two remote interior angles given; find the exterior angle at the third vertex."""
    a, b = rejection(rng, lambda r: _two_angles(r.randint(25, 85), r.randint(25, 85)))
    vertices = triangle(10.0, a, b)
    extended = (vertices[1][0] + 0.6 * (vertices[1][0] - vertices[0][0]), 0.0)
    diagram = Diagram()
    draw_triangle(diagram, vertices, point_names(rng, 3))
    diagram.segment(vertices[1], extended)
    diagram.angle(vertices[0], vertices[1], vertices[2], degrees(a))
    diagram.angle(vertices[2], vertices[0], vertices[1], degrees(180 - a - b))
    diagram.angle(vertices[1], extended, vertices[2], degrees("x"))
    answer = rational(180 - b)
    wrong = (rational(b), rational(a), rational(180 - a))
    return Draft("Find x.", answer, wrong, diagram, f"exterior_angle:{a},{b}", rng.uniform(-20, 20))


def isosceles_base_angle(rng: random.Random) -> Draft:
    """An isosceles triangle (equal sides ticked) with its apex angle given; find a base angle."""
    apex = 2 * rng.randint(10, 70)
    base = (180 - apex) / 2
    vertices = triangle(10.0, base, base)
    diagram = Diagram()
    draw_triangle(diagram, vertices, point_names(rng, 3))
    diagram.ticks(vertices[0], vertices[2])
    diagram.ticks(vertices[1], vertices[2])
    diagram.angle(vertices[2], vertices[0], vertices[1], degrees(apex))
    diagram.angle(vertices[0], vertices[1], vertices[2], degrees("x"))
    answer = rational(180 - apex, 2)
    wrong = (rational(apex), rational(180 - apex), rational(90 - apex) if apex < 90 else rational(apex - 45))
    return Draft("Find x.", answer, wrong, diagram, f"isosceles_base_angle:{apex}", rng.uniform(-30, 30))


SCALES = ((2, 1), (3, 1), (3, 2), (5, 2), (4, 3), (5, 3))


def similar_triangles(rng: random.Random) -> Draft:
    """Two similar triangles (equal angles marked); find a side of the larger from the ratio."""
    p, q = rng.choice(SCALES)
    a, b = q * rng.randint(2, 6), rng.randint(3, 12)
    gamma = rng.randint(45, 110)
    small = ((0.0, 0.0), (float(a), 0.0), polar(b, gamma))
    k, shift = p / q, 1.5 * a + 2.0
    large = ((shift, 0.0), (shift + k * a, 0.0), polar(k * b, gamma, (shift, 0.0)))
    names = point_names(rng, 6)
    diagram = Diagram()
    for shape, labels, sides in (
        (small, names[:3], (str(a), str(b))),
        (large, names[3:], (str(a * p // q), "x")),
    ):
        middle = draw_triangle(diagram, shape, labels)
        diagram.side_label(shape[0], shape[1], sides[0], middle)
        diagram.side_label(shape[0], shape[2], sides[1], middle)
        diagram.angle(shape[0], shape[1], shape[2])
        diagram.angle(shape[1], shape[2], shape[0], arcs=2)
    answer = rational(b * p, q)
    wrong = (rational(b * q, p), rational(b + a * p // q - a), rational(a * p // q))
    statement = (
        f"\\triangle {''.join(names[:3])} \\sim \\triangle {''.join(names[3:])}. Find x."
        + hint_unless_integer(answer)
    )
    return Draft(statement, answer, wrong, diagram, f"similar_triangles:{p}/{q},{a},{b},{gamma}")


TEMPLATES: tuple[Template, ...] = (
    pythagoras_hypotenuse,
    pythagoras_leg,
    angle_sum,
    angle_sum_algebra,
    exterior_angle,
    isosceles_base_angle,
    similar_triangles,
)
