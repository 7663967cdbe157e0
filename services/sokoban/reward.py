"""The seed's episode reward: mean turn reward + 5 if solved + progress in box-to-target distance.

`reward(turn_rewards, info)` is the hook a trainer's rollout calls with the turn rewards it collected and
the info of the last step (every step's info carries `metrics`, so a truncated episode works too).
`solved(turn_rewards, info)` is a sparse alternative: 1 for a solved level, else 0. Under the seed's
reward a failing episode that pushes a box the wrong way scores below one that never reaches the env (a
reply cut by its token limit), which GRPO learns to exploit; success alone has no such way out.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from vistarl.services.sokoban.game import Pos

SOLVED_BONUS = 5.0


def box_target_distance(boxes: Collection[Pos], targets: Collection[Pos]) -> int:
    """Greedy matching distance: each box, in sorted order, takes its nearest remaining target (Manhattan).

    Ties go to the first target in sorted order. As in the seed, the last target is never used up, so
    extra boxes (a malformed level) still count their distance to it.
    """
    remaining = sorted(targets)
    total = 0
    for br, bc in sorted(boxes):
        if not remaining:
            break
        nearest = min(remaining, key=lambda t: abs(t[0] - br) + abs(t[1] - bc))
        total += abs(nearest[0] - br) + abs(nearest[1] - bc)
        if len(remaining) > 1:
            remaining.remove(nearest)
    return total


def episode_reward(turn_rewards: Sequence[float], solved: bool, dist0: float, dist1: float) -> float:
    """mean(turn rewards) + 5·solved + (dist0 − dist1); the mean of no turns is 0."""
    mean = sum(turn_rewards) / len(turn_rewards) if turn_rewards else 0.0
    return mean + SOLVED_BONUS * solved + (dist0 - dist1)


def reward(turn_rewards: Sequence[float], info: Mapping[str, Any]) -> float:
    """Trainer hook: the episode reward from the turn rewards and the last step's `info["metrics"]`."""
    metrics = info["metrics"]
    return episode_reward(turn_rewards, bool(metrics["success"]), metrics["dist0"], metrics["dist1"])


def solved(turn_rewards: Sequence[float], info: Mapping[str, Any]) -> float:
    """Trainer hook: 1.0 when the episode solved its level, else 0.0 (whatever ended it)."""
    return float(bool(info.get("metrics", {}).get("success", False)))
