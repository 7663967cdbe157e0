"""First-person frames of a room, rasterised by OpenGL (moderngl on a headless EGL context).

On a CPU-only server Mesa's llvmpipe does the rasterising; `docs/vsi.md` gives the measurements behind
this choice. Each frame has two outputs from one draw: the RGB view and an object-id buffer (object k
is id k + 1; floor, walls and ceiling are negative; nothing is 0), from which visibility is counted
and each visible object gets its category label drawn at the middle of its visible pixels.

The room is closed (floor, four walls, ceiling), so every pixel shows something. Faces carry their
size in metres, so the fragment shader draws one-pixel outlines on box and wall edges and a 1 m grid
on the floor, square with the walls. One GL context serves a process (recreated after a fork), under
a lock: envs in a server's threads take turns.
"""

from __future__ import annotations

import colorsys
import functools
import os
import threading
import zlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray
from PIL import Image, ImageDraw, ImageFont

from vistarl.services.vsi.camera import Pose, view_projection
from vistarl.services.vsi.geometry import Array, Box, cross
from vistarl.services.vsi.scenes import Scene, load_vsibench

FLOOR_ID, WALL_ID, CEILING_ID = -1, -2, -3
FLOOR_COLOR = (0.62, 0.55, 0.47)
WALL_COLOR = (0.86, 0.86, 0.83)
CEILING_COLOR = (0.94, 0.94, 0.94)
LIGHT = np.array([0.35, 0.55, 0.76]) / np.linalg.norm([0.35, 0.55, 0.76])
LABEL_MIN_PIXELS = 0.003
"""An object gets a label when it covers at least this fraction of the frame."""
SCENE_CACHE = 32
"""Scenes whose vertex buffers stay on the GL context."""

_VERTEX = np.dtype([("pos", "f4", 3), ("color", "f4", 3), ("uv", "f4", 2), ("size", "f4", 2), ("id", "i4")])

_VERTEX_SHADER = """
#version 330
uniform mat4 mvp;
in vec3 in_pos;
in vec3 in_color;
in vec2 in_uv;
in vec2 in_size;
in int in_id;
out vec3 v_color;
out vec2 v_uv;
flat out vec2 v_size;
flat out int v_id;
void main() {
    gl_Position = mvp * vec4(in_pos, 1.0);
    v_color = in_color;
    v_uv = in_uv;
    v_size = in_size;
    v_id = in_id;
}
"""

# A face with a size gets outlines within about a pixel of its border; the floor (size 0) a 1 m grid.
_FRAGMENT_SHADER = """
#version 330
in vec3 v_color;
in vec2 v_uv;
flat in vec2 v_size;
flat in int v_id;
layout(location = 0) out vec4 f_color;
layout(location = 1) out int f_id;
void main() {
    float pixel = max(fwidth(v_uv.x), fwidth(v_uv.y));
    vec2 border = v_size.x > 0.0 ? min(v_uv, v_size - v_uv) : abs(fract(v_uv + 0.5) - 0.5);
    float line = min(border.x, border.y) < pixel ? 0.55 : 1.0;
    f_color = vec4(v_color * line, 1.0);
    f_id = v_id;
}
"""


class RenderError(RuntimeError):
    """No OpenGL context could be made (no EGL, or no Mesa driver)."""


@dataclass(frozen=True)
class Frame:
    """One rendered view: the RGB image and its object-id buffer (rows top to bottom)."""

    image: Image.Image
    ids: NDArray[np.int32]


@functools.cache
def category_color(category: str) -> tuple[float, float, float]:
    """A stable colour per category, in 0..1: VSI-Bench's categories step round the hue circle by the golden
    ratio in alphabetical order (neighbours differ), any other name takes its hue from its CRC-32."""
    known = sorted({obj.category for scene in load_vsibench().values() for obj in scene.objects})
    index = known.index(category) if category in known else zlib.crc32(category.encode())
    hue = (index * 0.618034) % 1.0
    return colorsys.hsv_to_rgb(hue, (0.55, 0.75)[index % 2], (0.95, 0.8, 0.65)[index % 3])


def render_frames(scene: Scene, poses: Sequence[Pose], size: int, labels: bool = True) -> list[Frame]:
    """The views from `poses`, `size`×`size` pixels; with `labels`, category names on visible objects."""
    frames = []
    for pose in poses:
        rgb, ids = _gl().draw(scene, pose, size, with_color=True)
        image = Image.fromarray(rgb, "RGB")
        if labels:
            draw_labels(image, ids, scene)
        frames.append(Frame(image, ids))
    return frames


def render_ids(scene: Scene, poses: Sequence[Pose], size: int) -> list[NDArray[np.int32]]:
    """Only the object-id buffers of the views from `poses` (for visibility counts)."""
    return [_gl().draw(scene, pose, size, with_color=False)[1] for pose in poses]


def visible_pixels(ids: NDArray[np.int32], n_objects: int) -> NDArray[np.int64]:
    """Pixels showing each object, (n_objects,)."""
    return np.bincount(ids[ids > 0].ravel() - 1, minlength=n_objects)[:n_objects]


def draw_labels(image: Image.Image, ids: NDArray[np.int32], scene: Scene) -> None:
    """Write each sufficiently visible object's category at the middle of its visible pixels."""
    side = image.size[0]
    step = max(1, side // 96)
    coarse = ids[::step, ::step]
    counts = visible_pixels(coarse, len(scene.objects))
    shown = np.flatnonzero(counts >= LABEL_MIN_PIXELS * coarse.size)
    if not len(shown):
        return
    grid = np.indices(coarse.shape, dtype=np.float64)
    mask = coarse > 0
    keys = coarse[mask] - 1
    mean_row = np.bincount(keys, weights=grid[0][mask], minlength=len(scene.objects))
    mean_col = np.bincount(keys, weights=grid[1][mask], minlength=len(scene.objects))
    font = label_font(max(9, side // 30))
    draw = ImageDraw.Draw(image)
    for index in shown:
        text = scene.objects[index].category
        x = (mean_col[index] / counts[index] + 0.5) * step
        y = (mean_row[index] / counts[index] + 0.5) * step
        left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
        width, height = right - left, bottom - top
        x0 = int(min(max(x - width / 2, 1), side - width - 3))
        y0 = int(min(max(y - height / 2, 1), side - height - 3))
        draw.rectangle((x0 - 2, y0 - 2, x0 + width + 2, y0 + height + 2), fill=(25, 25, 25))
        draw.text((x0 - left, y0 - top), text, fill=(255, 255, 255), font=font)


@functools.cache
def label_font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    """Pillow's bundled font at `size` pixels."""
    return ImageFont.load_default(size=size)


def scene_vertices(scene: Scene) -> NDArray[Any]:
    """Every triangle of a room as vertices (`_VERTEX`): floor, walls, ceiling, then each object's box."""
    z0, z1 = scene.floor_z, scene.floor_z + scene.wall_height
    corners = [(float(x), float(y)) for x, y in scene.wall_corners()]
    walls = [
        [(bx, by, z0), (ax, ay, z0), (ax, ay, z1), (bx, by, z1)]
        for (ax, ay), (bx, by) in zip(corners, corners[1:] + corners[:1], strict=True)
    ]
    room = np.array([[(x, y, z0) for x, y in corners], *walls, [(x, y, z1) for x, y in corners[::-1]]])
    room_vertices = _quads(room, np.array([FLOOR_COLOR] + [WALL_COLOR] * 4 + [CEILING_COLOR]))
    room_vertices["id"] = np.repeat([FLOOR_ID] + [WALL_ID] * 4 + [CEILING_ID], 6)
    floor = room_vertices[:6]
    floor["uv"], floor["size"] = scene.to_room(floor["pos"][:, :2].astype(np.float64)), 0.0
    faces = np.concatenate([_box_faces(obj.box) for obj in scene.objects])
    colors = np.repeat([category_color(obj.category) for obj in scene.objects], 6, axis=0)
    object_vertices = _quads(faces, colors)
    object_vertices["id"] = np.repeat(np.arange(1, len(scene.objects) + 1), 36)
    return np.concatenate([room_vertices, object_vertices])


def _box_faces(box: Box) -> Array:
    """The six faces of a box as (6, 4, 3) corner quads, counter-clockwise seen from outside."""
    faces = []
    handed = np.sign(np.linalg.det(box.axes))
    for i in range(3):
        j, k = (i + 1) % 3, (i + 2) % 3
        for sign in (-1.0, 1.0):
            base = box.center + sign * box.half[i] * box.axes[i]
            u, v = box.half[j] * box.axes[j], box.half[k] * box.axes[k]
            if sign * handed < 0:
                u, v = v, u
            faces.append([base - u - v, base + u - v, base + u + v, base - u + v])
    return np.array(faces)


def _quads(points: Array, colors: Array) -> NDArray[Any]:
    """Two triangles per quad p0 p1 p2 p3 ((Q, 4, 3), counter-clockwise seen from the front), shaded by
    its normal, with uv in metres from p0 along p0→p1 and p0→p3; ids are left 0."""
    across, up = points[:, 1] - points[:, 0], points[:, 3] - points[:, 0]
    width, height = np.linalg.norm(across, axis=1), np.linalg.norm(up, axis=1)
    normal = cross(across, up)
    normal /= np.maximum(np.linalg.norm(normal, axis=1, keepdims=True), 1e-12)
    shade = 0.62 + 0.38 * np.abs(normal @ LIGHT)
    zeros = np.zeros_like(width)
    uv = np.stack(
        [
            np.stack([zeros, zeros], 1),
            np.stack([width, zeros], 1),
            np.stack([width, height], 1),
            np.stack([zeros, height], 1),
        ],
        1,
    )
    order = [0, 1, 2, 0, 2, 3]
    vertices = np.zeros((len(points), 6), dtype=_VERTEX)
    vertices["pos"] = points[:, order]
    vertices["color"] = (colors * shade[:, None])[:, None, :]
    vertices["uv"] = uv[:, order]
    vertices["size"] = np.stack([width, height], 1)[:, None, :]
    return vertices.reshape(-1)


class _Gl:
    """One process's GL context, program, framebuffers by size and vertex arrays by scene."""

    def __init__(self) -> None:
        import moderngl

        try:
            self.ctx = moderngl.create_standalone_context(backend="egl")  # type: ignore[arg-type]
        except Exception as exc:
            raise RenderError(
                f"no OpenGL context through EGL ({exc}); "
                "on Debian install libegl1, libgl1 and libgl1-mesa-dri"
            ) from exc
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.program = self.ctx.program(vertex_shader=_VERTEX_SHADER, fragment_shader=_FRAGMENT_SHADER)
        mvp = self.program["mvp"]
        assert isinstance(mvp, moderngl.Uniform)
        self.mvp = mvp
        self.framebuffers: dict[int, Any] = {}
        self.scenes: OrderedDict[Scene, tuple[Any, Any]] = OrderedDict()
        self.flags = moderngl.DEPTH_TEST | moderngl.CULL_FACE

    def draw(self, scene: Scene, pose: Pose, size: int, with_color: bool) -> tuple[Any, NDArray[np.int32]]:
        """(RGB array or None, id buffer) of one view."""
        mvp = view_projection(scene, pose).T.astype("f4")
        with self.lock, self.ctx:
            framebuffer = self._framebuffer(size)
            framebuffer.use()
            framebuffer.clear(0.0, 0.0, 0.0, 0.0)
            self.ctx.enable_only(self.flags)
            self.mvp.write(mvp.tobytes())
            self._vertex_array(scene).render()
            ids = np.frombuffer(framebuffer.read(attachment=1, components=1, dtype="i4"), dtype=np.int32)
            rgb = framebuffer.read(attachment=0, components=3) if with_color else None
        ids = ids.reshape(size, size)[::-1]
        if rgb is None:
            return None, ids
        return np.frombuffer(rgb, dtype=np.uint8).reshape(size, size, 3)[::-1], ids

    def _framebuffer(self, size: int) -> Any:
        if size not in self.framebuffers:
            color = self.ctx.renderbuffer((size, size), components=4)
            ids = self.ctx.renderbuffer((size, size), components=1, dtype="i4")
            depth = self.ctx.depth_renderbuffer((size, size))
            self.framebuffers[size] = self.ctx.framebuffer([color, ids], depth)
        return self.framebuffers[size]

    def _vertex_array(self, scene: Scene) -> Any:
        """The scene's vertex array (by scene object), uploaded on first use; the least recently used beyond
        the cache go."""
        if scene in self.scenes:
            self.scenes.move_to_end(scene)
            return self.scenes[scene][1]
        buffer = self.ctx.buffer(scene_vertices(scene).tobytes())
        attributes = ("in_pos", "in_color", "in_uv", "in_size", "in_id")
        vertex_array = self.ctx.vertex_array(self.program, [(buffer, "3f 3f 2f 2f 1i", *attributes)])
        self.scenes[scene] = (buffer, vertex_array)
        while len(self.scenes) > SCENE_CACHE:
            old_buffer, old_array = self.scenes.popitem(last=False)[1]
            old_array.release()
            old_buffer.release()
        return vertex_array


_STATE: dict[str, _Gl] = {}


def _gl() -> _Gl:
    """This process's GL state, made on first use (and again in a forked child)."""
    gl = _STATE.get("gl")
    if gl is None or gl.pid != os.getpid():
        gl = _STATE["gl"] = _Gl()
    return gl
