"""The camera: a pose on the floor plan, its view and projection matrices, and the moves the agent makes.

A pose is (x, y) in metres, yaw in degrees counter-clockwise from +x, and pitch in degrees (up is
positive); the eye is `EYE_HEIGHT` above the floor and the field of view is `FOV_DEG` both ways (square
frames), so four quarter turns see all round. Moves keep the eye `WALL_CLEARANCE` inside the walls; a move
that would cross a wall is refused whole (`docs/vsi.md`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import Enum, auto
from typing import Any

import numpy as np

from vistarl.services.vsi.geometry import Array
from vistarl.services.vsi.scenes import Scene

FOV_DEG = 90.0
EYE_HEIGHT = 1.5
NEAR, FAR = 0.05, 100.0
TURN_DEG = 90.0
PITCH_STEP_DEG = 15.0
MAX_PITCH_DEG = 45.0
FORWARD_M = 1.0
SIDE_M = 0.5
WALL_CLEARANCE = 0.2
TOUR_FRAMES = 8
TOUR_INSET = 0.5
"""Tour stops lie this fraction of the way from the room's middle to its walls."""


class Action(str, Enum):
    """The agent's moves; each value, the action's name, is its member name in lower case."""

    @staticmethod
    def _generate_next_value_(name: str, start: int, count: int, last_values: list[Any]) -> str:
        return name.lower()

    ROTATE_LEFT = auto()
    ROTATE_RIGHT = auto()
    MOVE_FORWARD = auto()
    MOVE_BACKWARD = auto()
    MOVE_LEFT = auto()
    MOVE_RIGHT = auto()
    LOOK_UP = auto()
    LOOK_DOWN = auto()


ACTION_DESCRIPTIONS: dict[Action, str] = {
    Action.ROTATE_LEFT: f"turn {TURN_DEG:g}° to the left",
    Action.ROTATE_RIGHT: f"turn {TURN_DEG:g}° to the right",
    Action.MOVE_FORWARD: f"step {FORWARD_M:g} m forward",
    Action.MOVE_BACKWARD: f"step {FORWARD_M:g} m backward",
    Action.MOVE_LEFT: f"step {SIDE_M:g} m to the left",
    Action.MOVE_RIGHT: f"step {SIDE_M:g} m to the right",
    Action.LOOK_UP: f"tilt the view {PITCH_STEP_DEG:g}° up (at most {MAX_PITCH_DEG:g}°)",
    Action.LOOK_DOWN: f"tilt the view {PITCH_STEP_DEG:g}° down (at most {MAX_PITCH_DEG:g}°)",
}

_STEPS: dict[Action, tuple[float, float]] = {
    Action.MOVE_FORWARD: (FORWARD_M, 0.0),
    Action.MOVE_BACKWARD: (-FORWARD_M, 0.0),
    Action.MOVE_LEFT: (0.0, SIDE_M),
    Action.MOVE_RIGHT: (0.0, -SIDE_M),
}


@dataclass(frozen=True)
class Pose:
    """Where the camera stands and looks."""

    x: float
    y: float
    yaw: float = 0.0
    pitch: float = 0.0

    def to_list(self) -> list[float]:
        """[x, y, yaw, pitch], JSON-safe."""
        return [self.x, self.y, self.yaw, self.pitch]

    @classmethod
    def from_list(cls, values: list[float]) -> Pose:
        """The pose `to_list` wrote."""
        x, y, yaw, pitch = (float(v) for v in values)
        return cls(x, y, yaw, pitch)


@dataclass(frozen=True)
class MoveResult:
    """A move's outcome: the new pose, whether a wall refused it, and whether the camera was already
    tilted as far as it goes that way (the view did not change)."""

    pose: Pose
    blocked: bool
    at_limit: bool = False

    def feedback(self, action: Action) -> str:
        """The turn's feedback text: done, blocked by a wall, or the camera at its pitch limit."""
        if self.blocked:
            return f"{action.value}: a wall blocks the way, so you did not move."
        if self.at_limit:
            way = "up" if action is Action.LOOK_UP else "down"
            limit = f"{MAX_PITCH_DEG:g}° {way}"
            return f"{action.value}: the camera is at its limit ({limit}), so the view did not change."
        return f"{action.value}: done."


def apply_action(scene: Scene, pose: Pose, action: Action) -> MoveResult:
    """The pose after `action`; a step whose end lies outside the walls' clearance leaves the pose as is."""
    if action in (Action.ROTATE_LEFT, Action.ROTATE_RIGHT):
        turn = TURN_DEG if action is Action.ROTATE_LEFT else -TURN_DEG
        return MoveResult(replace(pose, yaw=(pose.yaw + turn) % 360.0), blocked=False)
    if action in (Action.LOOK_UP, Action.LOOK_DOWN):
        tilt = PITCH_STEP_DEG if action is Action.LOOK_UP else -PITCH_STEP_DEG
        pitch = min(MAX_PITCH_DEG, max(-MAX_PITCH_DEG, pose.pitch + tilt))
        return MoveResult(replace(pose, pitch=pitch), blocked=False, at_limit=pitch == pose.pitch)
    ahead, left = _STEPS[action]
    yaw = math.radians(pose.yaw)
    x = pose.x + ahead * math.cos(yaw) - left * math.sin(yaw)
    y = pose.y + ahead * math.sin(yaw) + left * math.cos(yaw)
    if not inside_walls(scene, x, y):
        return MoveResult(pose, blocked=True)
    return MoveResult(replace(pose, x=round(x, 6), y=round(y, 6)), blocked=False)


def inside_walls(scene: Scene, x: float, y: float) -> bool:
    """Whether (x, y) keeps `WALL_CLEARANCE` from every wall."""
    x0, y0, x1, y1 = scene.extent
    rx, ry = scene.to_room(np.array([[x, y]]))[0]
    return (
        x0 + WALL_CLEARANCE <= rx <= x1 - WALL_CLEARANCE and y0 + WALL_CLEARANCE <= ry <= y1 - WALL_CLEARANCE
    )


def start_pose(scene: Scene) -> Pose:
    """Where the agent starts: the middle of the room, facing along the walls' x axis."""
    cx, cy = scene.center_xy
    return Pose(round(float(cx), 6), round(float(cy), 6), round(scene.wall_yaw, 6))


def tour_poses(scene: Scene) -> list[Pose]:
    """The scripted tour standing in for VSI-Bench's video: `TOUR_FRAMES` stops on a loop halfway out to the
    walls, walked counter-clockwise from the middle of the first wall, each looking ahead along the loop."""
    x0, y0, x1, y1 = scene.extent
    cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
    rx, ry = (x1 - x0) / 2 * TOUR_INSET, (y1 - y0) / 2 * TOUR_INSET
    angles = [-math.pi / 2 + 2 * math.pi * k / TOUR_FRAMES for k in range(TOUR_FRAMES)]
    stops = scene.from_room(np.array([(cx + rx * math.cos(a), cy + ry * math.sin(a)) for a in angles]))
    poses = []
    for (x, y), angle in zip(stops, angles, strict=True):
        yaw = math.degrees(math.atan2(ry * math.cos(angle), -rx * math.sin(angle))) + scene.wall_yaw
        poses.append(Pose(round(float(x), 6), round(float(y), 6), round(yaw % 360.0, 6), 0.0))
    return poses


def eye(scene: Scene, pose: Pose) -> Array:
    """The eye's world position."""
    return np.array([pose.x, pose.y, scene.floor_z + EYE_HEIGHT])


def view_projection(scene: Scene, pose: Pose) -> Array:
    """The 4x4 world-to-clip matrix (OpenGL conventions) of a pose."""
    yaw, pitch = math.radians(pose.yaw), math.radians(pose.pitch)
    forward = np.array([math.cos(pitch) * math.cos(yaw), math.cos(pitch) * math.sin(yaw), math.sin(pitch)])
    right = np.array([math.sin(yaw), -math.cos(yaw), 0.0])
    up = np.cross(right, forward)
    position = eye(scene, pose)
    view = np.eye(4)
    view[0, :3], view[1, :3], view[2, :3] = right, up, -forward
    view[:3, 3] = -view[:3, :3] @ position
    focal = 1.0 / math.tan(math.radians(FOV_DEG) / 2)
    projection = np.zeros((4, 4))
    projection[0, 0] = projection[1, 1] = focal
    projection[2, 2] = (FAR + NEAR) / (NEAR - FAR)
    projection[2, 3] = 2 * FAR * NEAR / (NEAR - FAR)
    projection[3, 2] = -1.0
    return projection @ view
