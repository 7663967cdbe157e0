"""Circle questions: area and circumference, arc length, sector area, inscribed angles, chord length."""

from __future__ import annotations

import random

import sympy

from vistarl.services.geo3k.generator.diagram import Diagram, Point
from vistarl.services.geo3k.generator.draft import (
    PI_HINT,
    Draft,
    Template,
    degrees,
    hint_unless_integer,
    point_names,
    polar,
    rational,
    rejection,
    sqrt,
)

CENTRE: Point = (0.0, 0.0)
CENTRAL_ANGLES = (30, 40, 45, 60, 72, 80, 90, 100, 120, 135, 150, 160)
PI = sympy.pi


def _circle(diagram: Diagram, name_away_from: Point = (0.0, 1.0)) -> None:
    """The unit circle and its centre O, named on the side away from `name_away_from`."""
    diagram.circle(CENTRE, 1.0)
    diagram.dot(CENTRE)
    diagram.label(CENTRE, "O", name_away_from)


def area_or_circumference(rng: random.Random) -> Draft:
    """A circle with its radius (or diameter) labelled; find its area or circumference."""
    r = rng.randint(2, 15)
    by_diameter, ask_area = rng.random() < 0.5, rng.random() < 0.5
    turn = rng.uniform(0, 180)
    edge, opposite = polar(1.0, turn), polar(-1.0, turn)
    start = opposite if by_diameter else CENTRE
    diagram = Diagram()
    _circle(diagram, name_away_from=polar(0.5, turn + 90))
    diagram.segment(start, edge)
    diagram.side_label(start, edge, str(2 * r if by_diameter else r), polar(0.5, turn - 90))
    if ask_area:
        answer, wrong = r * r * PI, (2 * r * PI, 4 * r * r * PI, r * PI)
    else:
        answer, wrong = 2 * r * PI, (r * r * PI, r * PI, 4 * r * PI)
    what = "area" if ask_area else "circumference"
    key = f"circle_{what}:{r},{by_diameter}"
    return Draft(f"Find the {what} of \\odot O. {PI_HINT}", answer, wrong, diagram, key)


def _sector(rng: random.Random, diagram: Diagram) -> tuple[int, int, list[str]]:
    """Draw a sector with a labelled central angle and radius; (angle, radius, names of its ends)."""
    angle, r = rng.choice(CENTRAL_ANGLES), rng.randint(2, 12)
    start = rng.uniform(0, 360)
    a, b = polar(1.0, start), polar(1.0, start + angle)
    names = point_names(rng, 2)
    _circle(diagram)
    diagram.segment(CENTRE, a)
    diagram.segment(CENTRE, b)
    diagram.side_label(CENTRE, a, str(r), b)
    diagram.angle(CENTRE, a, b, degrees(angle))
    diagram.point_names(((a, names[0]), (b, names[1])), CENTRE)
    return angle, r, names


def arc_length(rng: random.Random) -> Draft:
    """A central angle and radius given; find the length of the arc they cut off."""
    diagram = Diagram()
    angle, r, names = _sector(rng, diagram)
    answer = rational(angle * r, 180) * PI
    wrong = (rational(angle * r * r, 360) * PI, rational(angle * r, 360) * PI, rational(angle))
    statement = f"Find the length of \\widehat{{{''.join(names)}}}. {PI_HINT}"
    return Draft(statement, answer, wrong, diagram, f"arc_length:{angle},{r}")


def sector_area(rng: random.Random) -> Draft:
    """A central angle and radius given; find the area of the sector."""
    diagram = Diagram()
    angle, r, names = _sector(rng, diagram)
    answer = rational(angle * r * r, 360) * PI
    wrong = (rational(angle * r, 180) * PI, rational(angle * r * r, 180) * PI, r * r * PI)
    statement = f"Find the area of sector O{''.join(names)}. {PI_HINT}"
    return Draft(statement, answer, wrong, diagram, f"sector_area:{angle},{r}")


def inscribed_angle(rng: random.Random) -> Draft:
    """An inscribed angle and its intercepted arc: one given, find the other."""
    arc = 2 * rng.randint(15, 80)
    find_angle = rng.random() < 0.5
    start = rng.uniform(0, 360)
    a, b = polar(1.0, start), polar(1.0, start + arc)
    c = polar(1.0, start + arc + (360 - arc) * rng.uniform(0.35, 0.65))
    names = point_names(rng, 3)
    diagram = Diagram()
    _circle(diagram)
    diagram.segment(c, a)
    diagram.segment(c, b)
    diagram.point_names(((a, names[0]), (b, names[1]), (c, names[2])), CENTRE)
    diagram.label(polar(1.0, start + arc / 2), degrees(arc if find_angle else "x"), CENTRE)
    diagram.angle(c, a, b, degrees("x" if find_angle else arc // 2))
    answer = rational(arc // 2 if find_angle else arc)
    wrong = (rational(arc if find_angle else arc // 2), rational(180 - arc // 2), rational(360 - arc))
    return Draft("Find x.", answer, wrong, diagram, f"inscribed_angle:{arc},{find_angle}")


def chord_length(rng: random.Random) -> Draft:
    """The radius and a chord's distance from the centre given; find the chord."""
    r, d = rejection(rng, lambda g: _radius_and_distance(g.randint(3, 15), g.randint(1, 12)))
    half = (r * r - d * d) ** 0.5 / r
    turn = rng.uniform(0, 360)
    foot = polar(d / r, turn)
    a, b = polar(half, turn + 90, foot), polar(half, turn - 90, foot)
    names = point_names(rng, 2)
    diagram = Diagram()
    _circle(diagram)
    diagram.segment(a, b)
    diagram.segment(CENTRE, foot, dashed=True)
    diagram.segment(CENTRE, a)
    diagram.right_angle(foot, CENTRE, b)
    diagram.side_label(CENTRE, foot, str(d), b)
    diagram.side_label(CENTRE, a, str(r), b)
    diagram.point_names(((a, names[0]), (b, names[1])), CENTRE)
    answer = 2 * sqrt(r * r - d * d)
    wrong = (sqrt(r * r - d * d), 2 * sqrt(r * r + d * d), rational(2 * (r - d)))
    statement = f"Find {''.join(names)}." + hint_unless_integer(answer)
    return Draft(statement, answer, wrong, diagram, f"chord_length:{r},{d}")


def _radius_and_distance(r: int, d: int) -> tuple[int, int] | None:
    """A chord neither through the centre nor at the rim, so both lengths show."""
    return (r, d) if 0.25 * r <= d <= 0.8 * r else None


TEMPLATES: tuple[Template, ...] = (
    area_or_circumference,
    arc_length,
    sector_area,
    inscribed_angle,
    chord_length,
)
