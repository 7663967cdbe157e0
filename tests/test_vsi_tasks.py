"""Each VSI question type's answer on a small hand-made room, against answers worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.vsi_scenes import box, make_scene
from vistarl.services.vsi.appearance import VISIBILITY_SIZE, first_frames
from vistarl.services.vsi.camera import EYE_HEIGHT, TOUR_FRAMES, tour_poses
from vistarl.services.vsi.geometry import box_distance
from vistarl.services.vsi.question import QuestionType
from vistarl.services.vsi.render import render_ids
from vistarl.services.vsi.scenes import Scene
from vistarl.services.vsi.tasks import direction_of, drafts, route_turns

QT = QuestionType

# Floor at z = 0. Footprints: sofa x[-1, 1] y[-0.5, 0.5]; tv x[3.9, 4.1] y[-0.6, 0.6] z[0.65, 1.35];
# table x[-0.5, 0.5] y[2.5, 3.5]; bed x[-4, -2] y[-3.8, -2.2]; lamp x[1.85, 2.15] y[-2.15, -1.85];
# two chairs x[2.75, 3.25] and x[3.55, 4.05], y[2.75, 3.25].
ROOM = [
    ("sofa", box((0, 0, 0.4), (2.0, 1.0, 0.8))),
    ("tv", box((4, 0, 1.0), (0.2, 1.2, 0.7))),
    ("table", box((0, 3, 0.4), (1.0, 1.0, 0.8))),
    ("bed", box((-3, -3, 0.3), (2.0, 1.6, 0.6))),
    ("lamp", box((2, -2, 0.5), (0.3, 0.3, 1.0))),
    ("chair", box((3, 3, 0.45), (0.5, 0.5, 0.9))),
    ("chair", box((3.8, 3, 0.45), (0.5, 0.5, 0.9))),
]


@pytest.fixture(scope="module")
def room() -> Scene:
    return make_scene(ROOM, room_size=40.04)


def answers(scene: Scene, question_type: QuestionType) -> dict[str, str | None]:
    return {d.text: d.answer if d.answer is not None else d.choices[0] for d in drafts(scene, question_type)}


def test_counting_asks_only_about_categories_with_several_instances(room: Scene) -> None:
    assert answers(room, QT.OBJECT_COUNTING) == {"How many chair(s) are in this room?": "2"}


def test_size_is_the_longest_side_in_centimetres(room: Scene) -> None:
    found = {
        text.rsplit(" of the ", 1)[1].split(",")[0]: answer
        for text, answer in answers(room, QT.OBJECT_SIZE_ESTIMATION).items()
    }
    assert found == {"sofa": "200", "tv": "120", "table": "100", "bed": "200", "lamp": "100"}


def test_room_size_is_asked_where_the_walls_grow_to_it(room: Scene) -> None:
    """The footprints and the centre span x [-4, 4.1], y [-3.8, 3.5]: 59.13 m². Walls grown evenly to 64.04 m²
    keep the rectangle's middle and its sides' difference; 40.04 m² is less than the objects need, so
    the walls hold them 5 cm off and the room gets no room-size question."""
    roomy = make_scene(ROOM, room_size=64.04)
    x0, y0, x1, y1 = roomy.extent
    assert roomy.floor_area == pytest.approx(64.04) and roomy.floor_shows_room_size
    assert ((x0 + x1) / 2, (y0 + y1) / 2, (x1 - x0) - (y1 - y0)) == pytest.approx((0.05, -0.15, 0.8))
    assert list(answers(roomy, QT.ROOM_SIZE_ESTIMATION).values()) == ["64.0"]
    assert room.extent == pytest.approx((-4.05, -3.85, 4.15, 3.55))
    assert not room.floor_shows_room_size and answers(room, QT.ROOM_SIZE_ESTIMATION) == {}


def test_closest_point_distance_between_boxes() -> None:
    sofa, tv, table, bed = (b for _, b in ROOM[:4])
    assert box_distance(sofa, tv) == pytest.approx(2.9)  # x gap 3.9 - 1.0; y and z ranges overlap
    assert box_distance(table, tv) == pytest.approx(math.hypot(3.4, 1.9))
    assert box_distance(table, bed) == pytest.approx(math.hypot(1.5, 4.7))
    assert box_distance(sofa, box((0.5, 0, 0.4), (1, 1, 1))) == 0.0  # overlapping


def test_abs_distance_answers_to_a_decimetre(room: Scene) -> None:
    found = answers(room, QT.OBJECT_ABS_DISTANCE)
    sofa_tv = [a for text, a in found.items() if {"the sofa", "the tv"} <= set(_objects(text))]
    assert len(found) <= 6
    if sofa_tv:
        assert sofa_tv == ["2.9"]
    for text, answer in found.items():
        assert float(answer or 0) >= 0.2, text


def test_relative_distance_picks_the_nearest_category(room: Scene) -> None:
    # From the table's box: sofa 2.0 m (y gap), chair 2.25 m (the nearer of two), tv hypot(3.4, 1.9) = 3.9 m,
    # lamp hypot(1.35, 4.35) = 4.55 m, bed hypot(1.5, 4.7) = 4.93 m: all at least 0.15 m apart.
    by_hand = {"sofa": 2.0, "chair": 2.25, "tv": 3.9, "lamp": 4.55, "bed": 4.93}
    table = [d for d in drafts(room, QT.OBJECT_REL_DISTANCE) if d.text.endswith("to the table?")]
    assert table
    for draft in table:
        assert draft.choices[0] == min(draft.choices, key=by_hand.__getitem__)


@pytest.mark.parametrize(
    ("a", "b", "c", "expected"),
    [
        # Standing by the sofa facing the tv (+x): the table at 90° is left; 90° is a hard-level boundary.
        ("sofa", "tv", "table", {"easy": "left", "medium": "left", "hard": None}),
        # The bed at 225°: back-right; 225° is the medium (and easy) boundary between back and right.
        ("sofa", "tv", "bed", {"easy": None, "medium": None, "hard": "back-right"}),
        # The lamp at 315°: right, front-right.
        ("sofa", "tv", "lamp", {"easy": "right", "medium": "right", "hard": "front-right"}),
        # By the tv facing the sofa (-x): the table, at (-4, 3) from the tv, is 36.9° clockwise (323°).
        ("tv", "sofa", "table", {"easy": "right", "medium": "right", "hard": "front-right"}),
    ],
)
def test_relative_direction_levels(
    room: Scene, a: str, b: str, c: str, expected: dict[str, str | None]
) -> None:
    levels = {
        "easy": QT.OBJECT_REL_DIRECTION_EASY,
        "medium": QT.OBJECT_REL_DIRECTION_MEDIUM,
        "hard": QT.OBJECT_REL_DIRECTION_HARD,
    }
    assert {name: direction_of(room, qt, a, b, c) for name, qt in levels.items()} == expected


def test_direction_drafts_respect_the_distance_range(room: Scene) -> None:
    for level in (QT.OBJECT_REL_DIRECTION_EASY, QT.OBJECT_REL_DIRECTION_MEDIUM, QT.OBJECT_REL_DIRECTION_HARD):
        for draft in drafts(room, level):
            assert "bed" not in draft.text or "tv" not in draft.text  # the bed is 5.9 m from the tv


def test_route_turns_follow_the_geometry(room: Scene) -> None:
    # Facing +x from the sofa: the table lies at 90° (left); then heading +y, the bed lies at 153° (back).
    assert route_turns(room, "sofa", "tv", ["table", "bed"]) == ["left", "back"]
    # Via the tv first (no turn), then the table at 143° from +x: within 15° of 135°, ambiguous.
    assert route_turns(room, "sofa", "tv", ["tv", "table", "bed"]) is None
    for draft in drafts(room, QT.ROUTE_PLANNING):
        # The note names "[please fill in]" once; the two turns are the blanks.
        assert draft.text.count("[please fill in]") == 3 and len(set(draft.choices)) == 4


def _objects(text: str) -> list[str]:
    return [f"the {word}" for word in ("sofa", "tv", "table", "bed", "lamp") if f"the {word}" in text]


def test_appearance_order_is_the_order_of_first_visibility() -> None:
    # An 8 m x 8 m room (two flat markers in opposite corners fix the walls); a 10 cm box 0.4 m ahead of
    # the camera at four tour stops is first seen there: far stops see it at under 0.5% of the frame.
    markers = [
        ("rug", box((-3.9, -3.9, 0.005), (0.1, 0.1, 0.01))),
        ("rug", box((3.9, 3.9, 0.005), (0.1, 0.1, 0.01))),
    ]
    stops = tour_poses(make_scene(markers, room_size=64.0))
    placed = {"vase": 3, "clock": 1, "plant": 7, "fan": 5}
    objects = list(markers)
    for category, stop in placed.items():
        pose = stops[stop]
        ahead = np.array([pose.x, pose.y]) + 0.4 * np.array(
            [math.cos(math.radians(pose.yaw)), math.sin(math.radians(pose.yaw))]
        )
        objects.append((category, box((*ahead, EYE_HEIGHT), (0.1, 0.1, 0.1))))
    scene = make_scene(objects, room_size=64.0)
    assert tour_poses(scene) == stops and len(stops) == TOUR_FRAMES
    frames = first_frames(scene)
    assert {c: frames[c] for c in placed} == placed
    order = next(d.choices[0] for d in drafts(scene, QT.OBJ_APPEARANCE_ORDER) if "rug" not in d.text)
    assert order == "clock, vase, fan, plant"
    ids = render_ids(scene, stops, VISIBILITY_SIZE)
    assert all((ids[k] == 1 + len(markers) + i).sum() > 0 for i, k in enumerate(placed.values()))
