"""When each category first appears in the scripted tour: the order that appearance questions ask about.

The tour (`camera.tour_poses`) stands in for VSI-Bench's video. A category appears in the first tour
frame where one of its objects covers at least `VISIBLE_FRACTION` of the frame in the object-id buffer,
so an object hidden behind another does not count. Visibility is counted at `VISIBILITY_SIZE` pixels
whatever size the env shows, so answers do not depend on the image size.
"""

from __future__ import annotations

import functools

from vistarl.services.vsi.camera import tour_poses
from vistarl.services.vsi.render import render_ids, visible_pixels
from vistarl.services.vsi.scenes import Scene

VISIBILITY_SIZE = 128
VISIBLE_FRACTION = 0.005


@functools.lru_cache(maxsize=4096)
def first_frames(scene: Scene) -> dict[str, int]:
    """The tour frame (0-based) where each category is first visible; unseen categories are absent."""
    first: dict[str, int] = {}
    threshold = VISIBLE_FRACTION * VISIBILITY_SIZE**2
    for frame, ids in enumerate(render_ids(scene, tour_poses(scene), VISIBILITY_SIZE)):
        for index in (visible_pixels(ids, len(scene.objects)) >= threshold).nonzero()[0]:
            first.setdefault(scene.objects[index].category, frame)
    return first
