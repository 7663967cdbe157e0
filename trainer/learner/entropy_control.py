"""The weight of the entropy bonus, step by step: fixed, or adapted to hold the entropy near a target.

A fixed bonus (`algo.entropy_coef`) over a vocabulary of 151k tokens has no resting point. In the long
GPU runs of docs/results.md it first kept the policy exploring, then, once it outweighed the policy
gradient, flattened the distribution from 0.3 to 4-6 nats a token: greedy success stood still and nearly
every group's replies were scored alike. With `algo.entropy_target` the weight follows the measured
entropy instead (the adaptive entropy control of Skywork-OR1): it grows by `algo.entropy_coef_step`
after a step whose entropy was below the target and shrinks by as much after one above it, within
[0, `algo.entropy_coef_max`], and it applies only while the entropy is below the target.
"""

from __future__ import annotations

from typing import Any

from vistarl.trainer.config import AlgoConfig


class EntropyControl:
    """The entropy bonus's weight for the next update, from the entropies of the updates so far."""

    def __init__(self, algo: AlgoConfig) -> None:
        self.target = algo.entropy_target
        self.delta = algo.entropy_coef_step
        self.ceiling = algo.entropy_coef_max
        self.level = algo.entropy_coef
        self.below = True

    @property
    def coef(self) -> float:
        """The bonus weight of the next update: the level while the entropy is below the target, else 0."""
        return self.level if self.below else 0.0

    def observe(self, entropy: float) -> None:
        """Adapt to an update whose policy had `entropy` nats a token (a fixed bonus ignores it)."""
        if self.target is None:
            return
        self.below = entropy < self.target
        change = self.delta if self.below else -self.delta
        self.level = min(max(self.level + change, 0.0), self.ceiling)

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps, so that a resumed run goes on with the same weight."""
        return {"level": self.level, "below": self.below}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what `state_dict` returned."""
        self.level = float(state_dict["level"])
        self.below = bool(state_dict["below"])
