"""The Sokoban environment behind the seeds' hooks: `build_env`, and `SokobanEnv` with reset / step / format.

A turn is one model response: up to `max_actions_per_turn` moves, each scored by the per-move reward
table; the turn reward is their sum. The episode ends when every box is on a target or after
`max_steps` primitive moves (blocked moves count). Every step's info carries `metrics`; the final one
adds `episode_reward` (see `reward.py`), which is not the sum of the turn rewards, and `end_reward`, the
difference (`env_api.episode_end`).
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from typing import Any

from PIL import Image

from vistarl.services.env_api import Env, EnvObservation, StepResult, check_steppable, episode_end
from vistarl.services.sokoban.actions import parse_actions
from vistarl.services.sokoban.game import Game, Level
from vistarl.services.sokoban.levels import generated_level
from vistarl.services.sokoban.options import SokobanOptions
from vistarl.services.sokoban.prompt import observation_text, system_prompt
from vistarl.services.sokoban.render import render_image
from vistarl.services.sokoban.reward import box_target_distance, episode_reward


class SokobanEnv(Env[SokobanOptions]):
    """One Sokoban level, played as an episode that `reset()` restarts from the same initial state."""

    level: Level
    turn_rewards: list[float]
    steps: int
    valid_actions: int
    effective_actions: int
    _game: Game
    _done: bool
    _last_actions: list[str]

    def __init__(
        self, options: SokobanOptions | None = None, seed: int | None = None, *, level: Level | None = None
    ) -> None:
        """Fix the level now: `level` (a restored episode's), the options' own, or the one generated from
        `seed` / `options.seed` / at random."""
        self.options = options or SokobanOptions()
        self.seed: int | None = seed if level is not None else None
        self.optimal_moves: int | None = None
        fixed = level or self.options.fixed_level
        if fixed is not None:
            self.level = fixed
        else:
            if seed is None:
                seed = self.options.seed if self.options.seed is not None else secrets.randbelow(2**31)
            self.seed = seed
            generated = generated_level(self.options, self.seed)
            self.level, self.optimal_moves = generated.level, len(generated.solution)
        self._targets = self.level.targets
        self._started = False
        self._new_episode()
        self.dist0 = self._distance()

    @property
    def system_prompt(self) -> str:
        """The system prompt for this env's settings."""
        return system_prompt(self.options.max_actions_per_turn)

    @property
    def done(self) -> bool:
        """True once the episode has ended (solved or out of steps)."""
        return self._done

    def reset(self) -> tuple[EnvObservation, dict[str, Any]]:
        """Restart the level; info has the seed, the level as XSB, dist0 and the optimal length if known."""
        self._new_episode()
        self._started = True
        info = {
            "seed": self.seed,
            "level": self.level.to_xsb(),
            "dist0": self.dist0,
            "optimal_moves": self.optimal_moves,
            "max_steps": self.options.max_steps,
        }
        return self._observation(), info

    def step(self, response_text: str) -> StepResult:
        """Play the moves of one response: the turn reward is their sum; solving the level terminates the
        episode, running out of `max_steps` moves truncates it."""
        check_steppable(self._started, self._done)
        actions = parse_actions(response_text, self.options.max_actions_per_turn)
        reward = 0.0
        moved = 0
        taken: list[str] = []
        for action in actions:
            result = self._game.move(action)
            taken.append(action)
            reward += result.reward
            moved += result.moved
            self.steps += 1
            if self._game.solved or self.steps >= self.options.max_steps:
                break
        self.valid_actions += len(taken)
        self.effective_actions += moved
        self._last_actions = taken
        self.turn_rewards.append(reward)
        solved = self._game.solved
        self._done = solved or self.steps >= self.options.max_steps
        metrics = self.metrics()
        info: dict[str, Any] = {
            "actions": taken,
            "action_is_valid": bool(actions),
            "action_is_effective": moved > 0,
            "success": solved,
            "metrics": metrics,
        }
        if self._done:
            ended = episode_reward(self.turn_rewards, solved, self.dist0, metrics["dist1"])
            info.update(episode_end(ended, sum(self.turn_rewards)))
        return StepResult(
            self._observation(), reward, terminated=solved, truncated=not solved and self._done, info=info
        )

    def metrics(self) -> dict[str, Any]:
        """Episode metrics so far: success, steps, turns, valid/effective action counts, dist0, dist1."""
        return {
            "success": self._game.solved,
            "steps": self.steps,
            "turns": len(self.turn_rewards),
            "valid_actions": self.valid_actions,
            "effective_actions": self.effective_actions,
            "dist0": self.dist0,
            "dist1": self._distance(),
        }

    def render_text(self) -> str:
        """The current state as XSB text, one line per row."""
        return self._game.to_xsb()

    def render_image(self) -> Image.Image:
        """The current state as an RGB image, `cell_size` pixels per cell."""
        return render_image(self.level.grid, self._game.boxes, self._game.player, self.options.cell_size)

    def state(self) -> dict[str, Any]:
        """Everything `from_state` needs to continue this episode: options, level, positions, counters."""
        return {
            **super().state(),
            "level": self.level.to_xsb(),
            "optimal_moves": self.optimal_moves,
            "started": self._started,
            "done": self._done,
            "boxes": [list(box) for box in sorted(self._game.boxes)],
            "player": list(self._game.player),
            "steps": self.steps,
            "valid_actions": self.valid_actions,
            "effective_actions": self.effective_actions,
            "turn_rewards": list(self.turn_rewards),
            "last_actions": list(self._last_actions),
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> SokobanEnv:
        """The env `state()` described, continuing where it stopped (no level is generated again)."""
        options = SokobanOptions.model_validate(state["options"])
        env = cls(options, state["seed"], level=Level.from_xsb(state["level"]))
        env.optimal_moves = state["optimal_moves"]
        env._started = bool(state["started"])
        env._done = bool(state["done"])
        env._game.boxes = {(int(r), int(c)) for r, c in state["boxes"]}
        env._game.player = (int(state["player"][0]), int(state["player"][1]))
        env.steps = int(state["steps"])
        env.valid_actions = int(state["valid_actions"])
        env.effective_actions = int(state["effective_actions"])
        env.turn_rewards = [float(r) for r in state["turn_rewards"]]
        env._last_actions = [str(a) for a in state["last_actions"]]
        return env

    def _new_episode(self) -> None:
        """Put the level back in its initial state and zero the episode's counters."""
        self._game = Game(self.level)
        self._done = False
        self._last_actions = []
        self.turn_rewards = []
        self.steps = self.valid_actions = self.effective_actions = 0

    def _observation(self) -> EnvObservation:
        mode = self.options.render_mode
        grid = self.render_text() if mode in ("text", "both") else None
        images = [self.render_image()] if mode in ("vision", "both") else []
        return {"text": observation_text(grid, self._last_actions), "images": images}

    def _distance(self) -> int:
        return box_target_distance(self._game.boxes, self._targets)


def build_env(sample: Any = None, args: Any = None, **config: Any) -> SokobanEnv:
    """The seeds' hook: an env from a dataset row's `extra_info.env_config`, overridden by `config`.

    `sample` is a processed-dataset row (a mapping) or a rollout sample with a `metadata["env_config"]`;
    `args` (the trainer's arguments in the seeds) is not needed here.
    """
    base = _sample_env_config(sample) if sample is not None else {}
    return SokobanEnv(SokobanOptions.model_validate({**base, **config}))


def _sample_env_config(sample: Any) -> dict[str, Any]:
    """The env config carried by a dataset row or a rollout sample; a clear error when it is absent."""
    if isinstance(sample, Mapping):
        config = (sample.get("extra_info") or {}).get("env_config")
    else:
        config = (getattr(sample, "metadata", None) or {}).get("env_config")
    if not isinstance(config, Mapping):
        raise ValueError(
            "sample has no env config: expected extra_info.env_config (or metadata['env_config'])"
        )
    return dict(config)
