"""Parallel lines cut by a transversal: the eight angles at the two crossings, one given, one asked.

At each crossing the four angles are numbered counter-clockwise from the ray along the parallel
line's direction: 0 and 2 measure the transversal's slope φ, 1 and 3 measure 180° − φ. So angles
of the same parity are equal (vertical, corresponding, alternate) and the others are supplementary
(linear pairs, same-side interior).
"""

from __future__ import annotations

import random

from vistarl.services.geo3k.generator.diagram import Diagram, Point
from vistarl.services.geo3k.generator.draft import (
    Draft,
    Template,
    degrees,
    linear,
    polar,
    rational,
    rejection,
)

GAP = 4.0
HALF_LINE = 7.0
RAY = 3.0


def _slope_angles(slope: int) -> tuple[int, int, int, int]:
    """The four angles at a crossing, numbered as in the module docstring."""
    return (slope, 180 - slope, slope, 180 - slope)


def _figure(slope: int, given: tuple[int, int, str], asked: tuple[int, int, str]) -> Diagram:
    """Two horizontal parallels, the transversal at `slope`, two angles labelled (crossing, number, text)."""
    low: Point = (0.0, 0.0)
    high = polar(GAP / abs(polar(1.0, slope)[1]), slope)
    crossings = (low, high)
    diagram = Diagram()
    for y, crossing in ((0.0, low), (GAP, high)):
        left, right = (crossing[0] - HALF_LINE, y), (crossing[0] + HALF_LINE, y)
        diagram.segment(left, right)
        diagram.arrowheads(left, right)
    diagram.segment(polar(-RAY, slope, low), polar(RAY, slope, high))
    for index, number, text in (given, asked):
        centre = crossings[index]
        rays = (
            polar(RAY, 0, centre),
            polar(RAY, slope, centre),
            polar(RAY, 180, centre),
            polar(RAY, slope + 180, centre),
        )
        diagram.angle(centre, rays[number], rays[(number + 1) % 4], text)
    return diagram


def _positions(rng: random.Random) -> tuple[tuple[int, int], tuple[int, int]]:
    """Two different angle positions (crossing, number)."""
    positions = [(crossing, number) for crossing in (0, 1) for number in range(4)]
    given, asked = rng.sample(positions, 2)
    return given, asked


def transversal_angle(rng: random.Random) -> Draft:
    """One of the eight angles given; find another."""
    slope = rejection(rng, lambda r: _oblique(r.randint(35, 145)))[0]
    (gc, gn), (ac, an) = _positions(rng)
    angles = _slope_angles(slope)
    diagram = _figure(slope, (gc, gn, degrees(angles[gn])), (ac, an, degrees("x")))
    answer = rational(angles[an])
    wrong = (rational(180 - angles[an]), rational(90 - angles[an] % 90), rational(360 - angles[an]))
    key = f"transversal_angle:{slope},{gc}{gn},{ac}{an}"
    return Draft("Find x.", answer, wrong, diagram, key, rng.uniform(-25, 25))


def transversal_algebra(rng: random.Random) -> Draft:
    """Two of the eight angles given, one as a linear expression in x; solve for x."""
    slope = rejection(rng, lambda r: _oblique(r.randint(35, 145)))[0]
    (gc, gn), (ac, an) = _positions(rng)
    angles = _slope_angles(slope)
    x, m, q = rejection(rng, lambda r: _expression_for(angles[an], r.randint(2, 5), r.randint(4, 40)))
    diagram = _figure(slope, (gc, gn, degrees(angles[gn])), (ac, an, degrees(f"({linear(m, q)})")))
    answer = rational(x)
    wrong = (rational(180 - angles[an] - q, m), rational(angles[an] + q, m), rational(angles[an]))
    key = f"transversal_algebra:{slope},{gc}{gn},{ac}{an},{m},{q}"
    return Draft("Find x.", answer, wrong, diagram, key, rng.uniform(-25, 25))


def _oblique(slope: int) -> tuple[int] | None:
    """A slope far enough from 90° to tell the angles apart."""
    return (slope,) if abs(slope - 90) >= 12 else None


def _expression_for(angle: int, m: int, x: int) -> tuple[int, int, int] | None:
    """(x, m, q) with m·x + q = angle and a constant of modest size."""
    q = angle - m * x
    return (x, m, q) if -40 <= q <= 60 and q != 0 else None


TEMPLATES: tuple[Template, ...] = (transversal_angle, transversal_algebra)
