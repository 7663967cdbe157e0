"""The VSI renderer: occlusion on the object-id buffer, the room's surfaces, labels, and the map."""

from __future__ import annotations

import numpy as np

from tests.vsi_scenes import box, make_scene
from vistarl.services.vsi.camera import EYE_HEIGHT, Pose, start_pose, tour_poses
from vistarl.services.vsi.render import (
    CEILING_ID,
    FLOOR_ID,
    WALL_ID,
    render_frames,
    render_ids,
    visible_pixels,
)
from vistarl.services.vsi.scenes import median_scene
from vistarl.services.vsi.topdown import top_down_map

# The camera at the origin looks along +x; a small box 3 m ahead, a larger one 1.5 m ahead in between.
FAR = ("vase", box((3.0, 0.0, EYE_HEIGHT), (0.5, 0.5, 0.5)))
NEAR = ("cabinet", box((1.5, 0.0, EYE_HEIGHT), (0.2, 0.8, 0.8)))
CORNERS = [
    ("rug", box((-4.9, -4.9, 0.005), (0.1, 0.1, 0.01))),
    ("rug", box((4.9, 4.9, 0.005), (0.1, 0.1, 0.01))),
]
CAMERA = Pose(0.0, 0.0, 0.0, 0.0)


def test_a_box_behind_another_is_hidden_in_the_id_buffer() -> None:
    alone = make_scene([*CORNERS, FAR], room_size=100.0)
    both = make_scene([*CORNERS, FAR, NEAR], room_size=100.0)
    far_id = len(CORNERS) + 1
    (ids_alone,) = render_ids(alone, [CAMERA], 128)
    (ids_both,) = render_ids(both, [CAMERA], 128)
    assert (ids_alone == far_id).sum() > 60  # about 0.5 / 2.75 · 64 px on a side
    assert (ids_both == far_id).sum() == 0
    assert (ids_both == far_id + 1).sum() > (ids_alone == far_id).sum()
    # Turned round, the camera sees neither.
    (behind,) = render_ids(both, [Pose(0.0, 0.0, 180.0, 0.0)], 128)
    assert not np.isin(behind, [far_id, far_id + 1]).any()


def test_every_pixel_shows_floor_wall_ceiling_or_an_object() -> None:
    scene = median_scene()
    (frame,) = render_frames(scene, [start_pose(scene)], 96)
    assert frame.image.size == (96, 96) and frame.image.mode == "RGB"
    assert frame.ids.shape == (96, 96) and (frame.ids != 0).all()
    assert {FLOOR_ID, WALL_ID, CEILING_ID} <= set(np.unique(frame.ids).tolist())
    assert (frame.ids[-1] == FLOOR_ID).any() and (frame.ids[0] == CEILING_ID).any()  # level camera
    counts = visible_pixels(frame.ids, len(scene.objects))
    assert counts.sum() == (frame.ids > 0).sum()


def test_labels_are_drawn_on_visible_objects_only() -> None:
    scene = make_scene([*CORNERS, FAR, NEAR], room_size=100.0)
    plain, labelled = (render_frames(scene, [CAMERA], 192, labels=flag)[0] for flag in (False, True))
    difference = np.abs(np.asarray(plain.image, dtype=int) - np.asarray(labelled.image, dtype=int)).sum(
        axis=2
    )
    rows, cols = np.nonzero(difference)
    assert len(rows) > 0
    # The label sits on the cabinet's visible pixels (its box on the id buffer), not on the hidden vase.
    cabinet = np.argwhere(labelled.ids == len(CORNERS) + 2)
    assert cabinet[:, 0].min() <= rows.mean() <= cabinet[:, 0].max()
    assert cabinet[:, 1].min() <= cols.mean() <= cabinet[:, 1].max()


def test_tour_frames_and_the_map_draw() -> None:
    scene = median_scene()
    frames = render_frames(scene, tour_poses(scene), 64)
    assert len({frame.image.tobytes() for frame in frames}) == len(frames)
    image = top_down_map(scene, 256, tour_poses(scene), start_pose(scene))
    assert image.size == (256, 256) and len(image.getcolors(65536) or []) > 8
