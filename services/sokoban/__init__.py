"""The Sokoban environment (seed: slime's multi-turn VLM Sokoban): Python API and server factory.

The env itself (`vistarl.services.sokoban.env`, with the renderer and numpy) is imported on first use: a
server whose envs run in worker processes needs only the options, the prompt and the tools here.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from vistarl.services.env_api import Env, EnvFactory, checked_create
from vistarl.services.sokoban.actions import random_reply
from vistarl.services.sokoban.levels import seed_key
from vistarl.services.sokoban.options import SokobanOptions
from vistarl.services.sokoban.prompt import ACTION_FORMAT, system_prompt
from vistarl.services.sokoban.tools import TOOLS, tool_call_text

if TYPE_CHECKING:
    from vistarl.services.sokoban.env import SokobanEnv, build_env

__all__ = ["ENV_FACTORY", "SokobanEnv", "SokobanOptions", "build_env"]


class SampleInfo(BaseModel):
    """The `extra_info` of a processed-dataset row; `env_config` is the level and its settings."""

    model_config = ConfigDict(extra="allow")

    env_config: dict[str, Any]


class SokobanSample(BaseModel):
    """A row of the seed's processed dataset (what `vistarl data sokoban` writes), as a task."""

    model_config = ConfigDict(extra="allow")

    extra_info: SampleInfo


def __getattr__(name: str) -> Any:
    """`SokobanEnv` and `build_env` (the seeds' hook), from `vistarl.services.sokoban.env` on first use."""
    if name in ("SokobanEnv", "build_env"):
        return getattr(importlib.import_module("vistarl.services.sokoban.env"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _preload() -> None:
    """Import the env itself: its renderer (numpy), its generator's solver."""
    importlib.import_module("vistarl.services.sokoban.env")


def _new_env(options: SokobanOptions, seed: int | None, sample: SokobanSample | None) -> Env:
    """A Sokoban env for the options and the `/reset` seed (used by generated levels), or for a dataset
    row whose `env_config` the options override; the env module is imported here, at first use."""
    from vistarl.services.sokoban.env import SokobanEnv, build_env

    if sample is not None:
        return build_env(sample=sample.model_dump(), **options.model_dump(exclude_unset=True))
    return SokobanEnv(options, seed)


def _restore(state: dict[str, Any]) -> Env:
    """An env continuing the episode that `state` describes."""
    from vistarl.services.sokoban.env import SokobanEnv

    return SokobanEnv.from_state(state)


ENV_FACTORY = EnvFactory(
    name="sokoban",
    version="1.0.0",
    description=(
        "Sokoban (seed rules): push every box onto a target with Up/Down/Left/Right, up to 3 moves per turn. "
        "Levels are generated from a seed (verified solvable), given as XSB or initial_* fields, or taken "
        "from the vendored Boxoban files."
    ),
    system_prompt=system_prompt(),
    action_format=ACTION_FORMAT,
    options_model=SokobanOptions,
    sample_model=SokobanSample,
    restore=_restore,
    create=checked_create(_new_env, SokobanOptions, SokobanSample),
    tools=TOOLS,
    tool_call_text=tool_call_text,
    random_reply=random_reply,
    task_key=seed_key,
    import_path=__name__,
    preload=_preload,
)
