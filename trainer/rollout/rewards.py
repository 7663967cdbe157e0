"""Episode reward functions, named by import path like the seeds' `--custom-rm-path`.

A reward function has one signature:

    reward(turn_rewards: Sequence[float], info: Mapping[str, Any]) -> float

`turn_rewards` are the environment's per-turn rewards in order, and `info` is the info of the last
env call (the last step's, or the reset's when no step was taken), plus `generated_ids`: the
episode's generated (loss-mask 1) token ids, in order. `vistarl.services.sokoban.reward` is one.
Without a configured function, the episode reward is the environment's own `info["episode_reward"]`,
or the sum of the turn rewards when the episode ended before the environment gave one
(`vistarl.clients.protocol.episode_reward`, the rule TRL's envs read too).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from vistarl.clients.protocol import episode_reward as env_reward
from vistarl.trainer.imports import load_callable

__all__ = ["RewardFn", "env_reward", "load_reward_fn"]

RewardFn = Callable[[Sequence[float], Mapping[str, Any]], float]

DEFAULT_FUNCTION = "reward"


def load_reward_fn(path: str | None) -> RewardFn:
    """Resolve `pkg.module:function`, `pkg.module.function` or `pkg.module` (meaning its `reward`).

    None gives `env_reward`. Any other failure is a `ValueError` naming the path.
    """
    if path is None:
        return env_reward
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, attr = _split_dotted(path)
    if not module_name or not attr:
        raise ValueError(f"reward function {path!r} must look like 'package.module:function'")
    return cast(RewardFn, load_callable(module_name, attr, "reward"))


def _split_dotted(path: str) -> tuple[str, str]:
    """A dotted path is a module (whose `reward` is meant) if it imports, else `module.function`."""
    try:
        importlib.import_module(path)
    except ModuleNotFoundError as exc:
        if exc.name is None or not path.startswith(exc.name):
            raise ValueError(f"cannot import reward module {path!r}: {exc}") from exc
        module_name, _, attr = path.rpartition(".")
        return module_name, attr
    return path, DEFAULT_FUNCTION
