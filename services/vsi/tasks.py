"""The questions a scene admits, per VSI-Bench question type, with their exact answers (`docs/vsi.md`).

`drafts(scene, question_type)` lists every eligible question of one type (capped per scene as below),
in an order fixed by the scene and type alone. A draft holds the question and either its numeric answer
or its choices with the correct one first; `generator.py` letters them. Eligibility follows VSI-Bench:
"unique" means one instance by the layout's counts and by its boxes, and ambiguous questions (ties,
answers near a boundary) are skipped.
"""

from __future__ import annotations

import functools
import itertools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from vistarl.services.vsi.appearance import first_frames
from vistarl.services.vsi.geometry import box_distance, ccw_angle
from vistarl.services.vsi.question import QuestionType
from vistarl.services.vsi.scenes import Scene

MAX_ABS_DISTANCE_PER_SCENE = 6
MIN_ABS_DISTANCE = 0.2
MAX_PER_SCENE = 12
"""Drafts kept per scene for the sampled types (relative distance, direction, route, order)."""
TRIES = 400
"""Random draws per scene and type when the eligible combinations are too many to list."""
REL_DISTANCE_MIN = 0.15
REL_DISTANCE_GAP, REL_DISTANCE_GAP_LARGE, LARGE_ROOM = 0.15, 0.30, 40.0
DIRECTION_RANGE = (0.3, 5.0)
DIRECTION_MARGIN_DEG = 10.0
DIRECTION_MAX_STRAY_CORNERS = 2
ROUTE_MARGIN_DEG = 15.0
ROUTE_MIN_LEG = 1.0
TURNS = {"left": "Turn Left", "back": "Turn Back", "right": "Turn Right"}

COUNTING = "How many {category}(s) are in this room?"
ABS_DISTANCE = (
    "Measuring from the closest point of each object, what is the distance between the {a} and the {b} "
    "(in meters)?"
)
SIZE = (
    "What is the length of the longest dimension (length, width, or height) of the {category}, "
    "measured in centimeters?"
)
ROOM_SIZE = (
    "What is the size of this room (in square meters)? If multiple rooms are shown, estimate the size of "
    "the combined space."
)
REL_DISTANCE = (
    "Measuring from the closest point of each object, which of these objects ({choices}) is the closest "
    "to the {category}?"
)
DIRECTION = {
    QuestionType.OBJECT_REL_DIRECTION_EASY: (
        "If I am standing by the {a} and facing the {b}, is the {c} to the left or the right of the {b}?"
    ),
    QuestionType.OBJECT_REL_DIRECTION_MEDIUM: (
        "If I am standing by the {a} and facing the {b}, is the {c} to my left, right, or back?\n"
        "An object is to my back if I would have to turn at least 135 degrees in order to face it."
    ),
    QuestionType.OBJECT_REL_DIRECTION_HARD: (
        "If I am standing by the {a} and facing the {b}, is the {c} to my front-left, front-right, "
        "back-left, or back-right?\nThe directions refer to the quadrants of a Cartesian plane (if I am "
        "standing at the origin and facing along the positive y-axis)."
    ),
}
ROUTE = (
    "You are a robot beginning at the {start} facing the {facing}. You want to navigate to the {goal}. You "
    "will perform the following actions (Note: for each [please fill in], choose either 'turn back,' 'turn "
    "left,' or 'turn right.'): {steps} You have reached the final destination."
)
APPEARANCE = (
    "What will be the first-time appearance order of the following categories in the video: {listed}?"
)

# Sectors of the counter-clockwise angle from "facing" to the object, as [start, end) in degrees.
SECTORS: dict[QuestionType, tuple[tuple[float, float, str | None], ...]] = {
    QuestionType.OBJECT_REL_DIRECTION_EASY: ((0, 135, "left"), (135, 225, None), (225, 360, "right")),
    QuestionType.OBJECT_REL_DIRECTION_MEDIUM: ((0, 135, "left"), (135, 225, "back"), (225, 360, "right")),
    QuestionType.OBJECT_REL_DIRECTION_HARD: (
        (0, 90, "front-left"),
        (90, 180, "back-left"),
        (180, 270, "back-right"),
        (270, 360, "front-right"),
    ),
}
ROUTE_SECTORS = ((45, 135, "left"), (135, 225, "back"), (225, 315, "right"))


@dataclass(frozen=True)
class Draft:
    """An eligible question before lettering: numeric `answer`, or `choices` with the correct one first.

    In the text, `{choices}` stands for the options in their final order (relative distance lists them).
    """

    question_type: QuestionType
    text: str
    answer: str | None = None
    choices: tuple[str, ...] = ()


def drafts(scene: Scene, question_type: QuestionType) -> list[Draft]:
    """Every eligible question of one type in `scene`, in a fixed order (capped as the module says)."""
    return _cached_drafts(scene, question_type)


@functools.lru_cache(maxsize=8192)
def _cached_drafts(scene: Scene, question_type: QuestionType) -> list[Draft]:
    rng = random.Random(f"vsi-drafts/{scene.name}/{question_type.value}")
    return _BUILDERS[question_type](scene, question_type, rng)


def _counting(scene: Scene, qt: QuestionType, rng: random.Random) -> list[Draft]:
    """Categories of at least two instances whose boxes agree with the layout's count."""
    return [
        Draft(qt, COUNTING.format(category=c), answer=str(n))
        for c, n in sorted(scene.object_counts.items())
        if n >= 2 and scene.box_counts[c] == n
    ]


def _abs_distance(scene: Scene, qt: QuestionType, rng: random.Random) -> list[Draft]:
    """Pairs of unique objects at least `MIN_ABS_DISTANCE` apart, at most `MAX_ABS_DISTANCE_PER_SCENE`."""
    found = []
    for a, b in itertools.combinations(scene.unique_categories, 2):
        distance = _distance(scene, a, b)
        if distance >= MIN_ABS_DISTANCE:
            first, second = (a, b) if rng.random() < 0.5 else (b, a)
            found.append(
                Draft(qt, ABS_DISTANCE.format(a=first, b=second), answer=f"{round(distance, 1):.1f}")
            )
    rng.shuffle(found)
    return found[:MAX_ABS_DISTANCE_PER_SCENE]


def _size(scene: Scene, qt: QuestionType, rng: random.Random) -> list[Draft]:
    """The longest side of each unique object, in whole centimetres."""
    return [
        Draft(
            qt,
            SIZE.format(category=c),
            answer=str(round(float(scene.instances(c)[0].box.lengths.max()) * 100)),
        )
        for c in scene.unique_categories
    ]


def _room_size(scene: Scene, qt: QuestionType, rng: random.Random) -> list[Draft]:
    """The layout's floor area, one question per scene whose drawn floor shows it."""
    if not scene.floor_shows_room_size:
        return []
    return [Draft(qt, ROOM_SIZE, answer=f"{round(scene.room_size, 1):.1f}")]


def _rel_distance(scene: Scene, qt: QuestionType, rng: random.Random) -> list[Draft]:
    """A unique target and four other categories whose nearest instances are clearly ordered by distance."""
    gap = REL_DISTANCE_GAP_LARGE if scene.room_size > LARGE_ROOM else REL_DISTANCE_GAP
    found: dict[tuple[str, ...], Draft] = {}
    for _ in range(TRIES if scene.unique_categories else 0):
        target = rng.choice(scene.unique_categories)
        others = [c for c in scene.categories if c != target]
        if len(others) < 4 or len(found) >= MAX_PER_SCENE:
            break
        picked = rng.sample(others, 4)
        distances = sorted((_distance(scene, target, c), c) for c in picked)
        spread = np.diff([d for d, _ in distances])
        if distances[0][0] < REL_DISTANCE_MIN or spread.min() < gap:
            continue
        nearest = distances[0][1]
        choices = (nearest, *(c for c in picked if c != nearest))
        found.setdefault(
            (target, *sorted(picked)),
            Draft(qt, REL_DISTANCE.format(choices="{choices}", category=target), choices=choices),
        )
    return list(found.values())


def direction_of(scene: Scene, qt: QuestionType, a: str, b: str, c: str) -> str | None:
    """The answer to "standing by a, facing b, where is c?" at one level; None when it is ambiguous."""
    origin = _centroid(scene, a)[:2]
    forward = _centroid(scene, b)[:2] - origin
    angle = float(ccw_angle(forward, (_centroid(scene, c)[:2] - origin)[None, :])[0])
    label = _sector(SECTORS[qt], angle, DIRECTION_MARGIN_DEG)
    if label is None:
        return None
    corners = ccw_angle(forward, scene.instances(c)[0].box.corners[:, :2] - origin)
    stray = sum(_sector(SECTORS[qt], float(corner), 0.0) != label for corner in corners)
    return label if stray <= DIRECTION_MAX_STRAY_CORNERS else None


def _direction(scene: Scene, qt: QuestionType, rng: random.Random) -> list[Draft]:
    """Three unique objects, pairwise 0.3–5 m apart, where c lies clearly inside one sector."""
    unique = scene.unique_categories
    found: dict[tuple[str, str, str], Draft] = {}
    labels = [label for _, _, label in SECTORS[qt] if label is not None]
    for _ in range(TRIES if len(unique) >= 3 else 0):
        if len(found) >= MAX_PER_SCENE:
            break
        a, b, c = rng.sample(unique, 3)
        if (a, b, c) in found or not all(
            DIRECTION_RANGE[0] <= _distance(scene, x, y) <= DIRECTION_RANGE[1]
            for x, y in ((a, b), (a, c), (b, c))
        ):
            continue
        answer = direction_of(scene, qt, a, b, c)
        if answer is not None:
            choices = (answer, *(label for label in labels if label != answer))
            found[(a, b, c)] = Draft(qt, DIRECTION[qt].format(a=a, b=b, c=c), choices=choices)
    return list(found.values())


def route_turns(scene: Scene, start: str, facing: str, waypoints: Sequence[str]) -> list[str | None] | None:
    """The turn before each leg of a route (None: no turn, when the first leg heads to `facing`); None when
    a leg is shorter than `ROUTE_MIN_LEG` or a turn is near-straight or near a boundary."""
    heading = _centroid(scene, facing)[:2] - _centroid(scene, start)[:2]
    here = _centroid(scene, start)[:2]
    turns: list[str | None] = []
    for i, waypoint in enumerate(waypoints):
        leg = _centroid(scene, waypoint)[:2] - here
        if np.linalg.norm(leg) < ROUTE_MIN_LEG:
            return None
        if i == 0 and waypoint == facing:
            turns.append(None)
        else:
            turn = _sector(ROUTE_SECTORS, float(ccw_angle(heading, leg[None, :])[0]), ROUTE_MARGIN_DEG)
            if turn is None:
                return None
            turns.append(turn)
        heading, here = leg, here + leg
    return turns


def _route(scene: Scene, qt: QuestionType, rng: random.Random) -> list[Draft]:
    """Start at a unique object facing another; two turns on the way to a unique goal (4 or 5 moves)."""
    unique = scene.unique_categories
    found: dict[tuple[str, ...], Draft] = {}
    for _ in range(TRIES if len(unique) >= 4 else 0):
        if len(found) >= MAX_PER_SCENE:
            break
        start, facing, middle, goal = rng.sample(unique, 4)
        waypoints = (facing, middle, goal) if rng.random() < 0.5 else (middle, goal)
        turns = route_turns(scene, start, facing, waypoints)
        if turns is None or (start, facing, *waypoints) in found:
            continue
        correct = ", ".join(TURNS[t] for t in turns if t is not None)
        wrong = [
            ", ".join(combo)
            for combo in itertools.product(TURNS.values(), repeat=2)
            if ", ".join(combo) != correct
        ]
        text = ROUTE.format(start=start, facing=facing, goal=goal, steps=_route_steps(waypoints, turns))
        found[(start, facing, *waypoints)] = Draft(qt, text, choices=(correct, *rng.sample(wrong, 3)))
    return list(found.values())


def _route_steps(waypoints: Sequence[str], turns: Sequence[str | None]) -> str:
    """The numbered steps with the turns blanked: "1. [please fill in] 2. Go forward until the X …"."""
    steps = []
    for waypoint, turn in zip(waypoints, turns, strict=True):
        if turn is not None:
            steps.append("[please fill in]")
        steps.append(f"Go forward until the {waypoint}")
    return " ".join(f"{i}. {step}" for i, step in enumerate(steps, start=1)) + "."


def _appearance(scene: Scene, qt: QuestionType, rng: random.Random) -> list[Draft]:
    """Four categories first seen in four different tour frames; three other orders as distractors."""
    frames = first_frames(scene)
    seen = sorted(frames)
    found: dict[tuple[str, ...], Draft] = {}
    for _ in range(TRIES if len(seen) >= 4 else 0):
        if len(found) >= MAX_PER_SCENE:
            break
        picked = rng.sample(seen, 4)
        if len({frames[c] for c in picked}) < 4 or tuple(sorted(picked)) in found:
            continue
        order = tuple(sorted(picked, key=frames.__getitem__))
        wrong = [p for p in itertools.permutations(order) if p != order]
        choices = (", ".join(order), *(", ".join(p) for p in rng.sample(wrong, 3)))
        found[tuple(sorted(picked))] = Draft(qt, APPEARANCE.format(listed=", ".join(picked)), choices=choices)
    return list(found.values())


def _sector(sectors: Sequence[tuple[float, float, str | None]], angle: float, margin: float) -> str | None:
    """The label of the sector holding `angle`; None in a dropped sector or within `margin` of an edge."""
    for start, end, label in sectors:
        if start <= angle < end:
            if min(angle - start, end - angle) < margin:
                return None
            return label
    return None


def _centroid(scene: Scene, category: str) -> np.ndarray:
    """The box centre of a unique category."""
    return scene.instances(category)[0].box.center


@functools.lru_cache(maxsize=1 << 18)
def _distance(scene: Scene, a: str, b: str) -> float:
    """The closest-point distance between two categories: the minimum over their instances."""
    return min(
        box_distance(scene.objects[i].box, scene.objects[j].box)
        for i in scene.indices[a]
        for j in scene.indices[b]
    )


_BUILDERS: dict[QuestionType, Callable[[Scene, QuestionType, random.Random], list[Draft]]] = {
    QuestionType.OBJECT_COUNTING: _counting,
    QuestionType.OBJECT_ABS_DISTANCE: _abs_distance,
    QuestionType.OBJECT_SIZE_ESTIMATION: _size,
    QuestionType.ROOM_SIZE_ESTIMATION: _room_size,
    QuestionType.OBJECT_REL_DISTANCE: _rel_distance,
    QuestionType.OBJECT_REL_DIRECTION_EASY: _direction,
    QuestionType.OBJECT_REL_DIRECTION_MEDIUM: _direction,
    QuestionType.OBJECT_REL_DIRECTION_HARD: _direction,
    QuestionType.ROUTE_PLANNING: _route,
    QuestionType.OBJ_APPEARANCE_ORDER: _appearance,
}
