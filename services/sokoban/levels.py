"""Level identity: which seeds give the same puzzle, so that held-out levels are held out by content.

Two seeds often generate the same level: 6x6 one-box levels of at most 3 moves repeat so often that 110
of the 200 seeds from 100000 give a level that one of the seeds 0-1,999 also gives (docs/results.md,
"Held out by level"). A level's identity is `level_key`, its XSB text: the walls, floor and targets, the
boxes and the player's cell, which is everything the env shows (image and text grid) and everything
the answer depends on. Training skips the seeds whose key is a held-out level's (`EnvFactory.task_key`,
read by `vistarl.trainer.run.prompts.PromptSource`; the reading stage's boards in `demos.py`).
"""

from __future__ import annotations

import functools
import threading

from pydantic import BaseModel

from vistarl.services.sokoban.game import Level
from vistarl.services.sokoban.generator import GeneratedLevel, generate_level
from vistarl.services.sokoban.options import SokobanOptions

__all__ = ["generated_level", "level_key", "seed_key"]

LEVEL_CACHE_SIZE = 4096  # generated levels kept: a step's levels, each reset by every sample of its group
_generating = threading.Lock()


def level_key(level: Level) -> str:
    """The level's identity: its XSB text, which fixes walls, floor, targets, boxes and the player's cell.
    A player on another cell is another puzzle: another image, and other moves to answer."""
    return level.to_xsb()


def generated_level(options: SokobanOptions, seed: int) -> GeneratedLevel:
    """The level `seed` generates under the generator settings of `options` (what `SokobanEnv` plays),
    generated once for the last `LEVEL_CACHE_SIZE` asked: the samples of a GRPO group reset the same seed
    at once, in the env pool's threads, and the trainer asks for each training seed's `seed_key` first.
    One thread generates at a time (the search is Python, which holds the GIL anyway), so the samples of a
    group wait for the first one's level rather than each search it again."""
    with _generating:
        return _cached_level(
            seed,
            options.shape,
            options.num_boxes,
            options.wall_fraction,
            options.min_solution_len,
            options.max_moves,
        )


_cached_level = functools.lru_cache(maxsize=LEVEL_CACHE_SIZE)(generate_level)


def seed_key(options: BaseModel, seed: int) -> str | None:
    """`level_key` of the level of `seed` (Sokoban's `EnvFactory.task_key`); None when `options` fix the
    level, since then every seed plays the same one."""
    if not isinstance(options, SokobanOptions):
        raise TypeError(f"expected SokobanOptions, got {type(options).__name__}")
    if options.fixed_level is not None:
        return None
    return level_key(generated_level(options, seed).level)
