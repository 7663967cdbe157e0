"""VSI rendering speed on one core: 384×384 first-person frames of the median VSI-Bench scene.

    .venv/bin/python -m benchmarks.vsi_render [--seconds 5] [--size 384] [--core 0] [--all-cores]

Pins this process to one core (`--core`; `--all-cores` leaves it free) and asks Mesa's llvmpipe for one
rasteriser thread (LP_NUM_THREADS=1 unless set), then renders views from the 8 tour stops and the start
pose in turn, for `--seconds` each, after a warm-up, and prints frames per second, wall and CPU ms per
frame for:
- `frame`: what an env step shows: the GL draw, reading back the RGB and id buffers, and the category
  labels drawn on the image (`render_frames`);
- `frame, no labels`: the same without labels;
- `ids only`: the id buffer alone, as appearance order counts visibility (`render_ids`);
- `numpy z-buffer`: the same triangles rasterised with numpy (a flat colour and the id per triangle,
  no outlines, no labels, no near-plane clipping): the pure-PyPI alternative, for comparison;
- `PNG encode`: encoding one frame as the server does, not part of rendering, for scale.
The scene's vertex buffer is uploaded once (as an env's first frame does); the GL context is made
before timing starts.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from benchmarks.harness import benchmark_parser
from vistarl.clients.images import encode_image
from vistarl.services.vsi.camera import Pose, start_pose, tour_poses, view_projection
from vistarl.services.vsi.render import render_frames, render_ids, scene_vertices
from vistarl.services.vsi.scenes import Scene, median_scene


@dataclass(frozen=True)
class Figures:
    """One benchmark row."""

    name: str
    frames_per_s: float
    wall_ms: float
    cpu_ms: float


def measure(name: str, render: Callable[[int], object], seconds: float) -> Figures:
    """Call `render(i)` for i = 0, 1, … for `seconds` after a short warm-up; frames/s and ms per frame."""
    for i in range(20):
        render(i)
    count, start, cpu = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - start < seconds:
        render(count)
        count += 1
    wall, used = time.perf_counter() - start, time.process_time() - cpu
    return Figures(name, count / wall, 1000 * wall / count, 1000 * used / count)


def numpy_zbuffer(
    scene: Scene, vertices: NDArray[Any], pose: Pose, size: int
) -> tuple[NDArray[np.uint8], NDArray[np.int32]]:
    """A plain numpy z-buffer rasteriser of a scene's triangles (`scene_vertices`): one colour and one id
    per triangle."""
    clip = np.c_[vertices["pos"], np.ones(len(vertices))] @ view_projection(scene, pose).T
    colors, ids = (vertices["color"] * 255).astype(np.uint8), vertices["id"]
    depth = np.full((size, size), np.inf)
    rgb, id_buffer = np.zeros((size, size, 3), np.uint8), np.zeros((size, size), np.int32)
    for t in range(0, len(clip), 3):
        corner = clip[t : t + 3]
        if (corner[:, 3] <= 0.05).any():
            continue
        ndc = corner[:, :3] / corner[:, 3:]
        x, y, z = (ndc[:, 0] + 1) * size / 2, (1 - ndc[:, 1]) * size / 2, ndc[:, 2]
        area = (x[1] - x[0]) * (y[2] - y[0]) - (x[2] - x[0]) * (y[1] - y[0])
        x0, x1 = max(int(x.min()), 0), min(int(x.max()) + 1, size)
        y0, y1 = max(int(y.min()), 0), min(int(y.max()) + 1, size)
        if area >= 0 or x0 >= x1 or y0 >= y1:
            continue
        yy, xx = np.mgrid[y0:y1, x0:x1] + 0.5
        w0 = ((x[1] - xx) * (y[2] - yy) - (x[2] - xx) * (y[1] - yy)) / area
        w1 = ((x[2] - xx) * (y[0] - yy) - (x[0] - xx) * (y[2] - yy)) / area
        w2 = 1 - w0 - w1
        zz = w0 * z[0] + w1 * z[1] + w2 * z[2]
        win = (w0 >= 0) & (w1 >= 0) & (w2 >= 0) & (zz < depth[y0:y1, x0:x1])
        depth[y0:y1, x0:x1][win] = zz[win]
        rgb[y0:y1, x0:x1][win] = colors[t]
        id_buffer[y0:y1, x0:x1][win] = ids[t]
    return rgb, id_buffer


def main() -> None:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--size", type=int, default=384)
    parser.add_argument("--core", type=int, default=0)
    parser.add_argument("--all-cores", action="store_true")
    args = parser.parse_args()
    if not args.all_cores:
        os.sched_setaffinity(0, {args.core})
        os.environ.setdefault("LP_NUM_THREADS", "1")
    scene = median_scene()
    poses = [*tour_poses(scene), start_pose(scene)]
    size = args.size
    frame = render_frames(scene, poses[:1], size)[0].image
    vertices = scene_vertices(scene)
    rows = [
        measure("frame", lambda i: render_frames(scene, [poses[i % len(poses)]], size), args.seconds),
        measure(
            "frame, no labels",
            lambda i: render_frames(scene, [poses[i % len(poses)]], size, labels=False),
            args.seconds,
        ),
        measure("ids only", lambda i: render_ids(scene, [poses[i % len(poses)]], size), args.seconds),
        measure(
            "numpy z-buffer",
            lambda i: numpy_zbuffer(scene, vertices, poses[i % len(poses)], size),
            args.seconds,
        ),
        measure("PNG encode", lambda i: encode_image(frame), args.seconds),
    ]
    where = "all cores" if args.all_cores else f"core {args.core}"
    print(f"scene {scene.name} ({len(scene.objects)} objects), {size}x{size}, {where}")
    print("| what | frames/s | wall ms/frame | CPU ms/frame |\n|---|---:|---:|---:|")
    for row in rows:
        print(f"| {row.name} | {row.frames_per_s:.0f} | {row.wall_ms:.2f} | {row.cpu_ms:.2f} |")


if __name__ == "__main__":
    main()
