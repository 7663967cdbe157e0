"""Expert demonstrations: the solver's optimal moves played through the env, as a chat conversation; and
boards to read, the image in and its text grid out.

Each demonstration is what the policy should have said: the env's own system prompt, first observation
and feedback (rendered exactly as the env renders them), and replies in the seed's answer format with
up to `max_actions_per_turn` moves each. `vistarl sokoban demos` writes them for `vistarl sft`.

A transcription (`transcription`) teaches the policy to see the board before it plays: the same system
prompt and image as an episode's, an instruction to write the board down, and as the reply the board's
text grid (XSB), which the image alone shows. `vistarl demo learn` writes `sft.transcribe_boards` of them
for SFT's reading stage (`sft.transcribe_data`, docs/results.md), leaving out every board of a held-out
level or that shows one (`transcriptions`).

Each record names the levels it shows or comes from by their keys (`levels`, `levels.level_key`), so a
file of them can be checked against the held-out levels (`vistarl demo learn` prints the overlap).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator, Set
from typing import Any, Literal

from vistarl.services.env_api import user_message
from vistarl.services.sokoban.env import SokobanEnv
from vistarl.services.sokoban.game import DIRECTIONS, Game, Level
from vistarl.services.sokoban.levels import level_key
from vistarl.services.sokoban.options import SokobanOptions
from vistarl.services.sokoban.prompt import IMAGE_HINT
from vistarl.services.sokoban.render import render_image
from vistarl.services.sokoban.solver import solve

__all__ = [
    "MAX_SKIPPED_BOARDS",
    "TRANSCRIBE_FIRST_SEED",
    "TRANSCRIBE_INSTRUCTION",
    "demonstration",
    "transcription",
    "transcriptions",
]

SystemPrompt = bool | Literal["alternate"]
"""Whether boards to read carry the env's system prompt: always, never, or every other board."""

TRANSCRIBE_INSTRUCTION = "Write the board as a text grid, one line per row."
TRANSCRIBE_FIRST_SEED = 1_000_000  # above the demonstrations' seeds and both held-out sets
MAX_RANDOM_MOVES = 2  # a board is a level's start or a state a few moves in, as later turns show them
MAX_SKIPPED_BOARDS = 10_000  # boards in a row left out as held out before `transcriptions` gives up


def demonstration(options: SokobanOptions, seed: int, time_limit_s: float = 10.0) -> dict[str, Any]:
    """The solved episode of level `seed` as `{episode_id, env, seed, levels, episode_reward, success,
    messages}`, `levels` the level's key; messages hold PIL images, which the caller encodes. Raises
    `ValueError` if the solver gives up."""
    env = SokobanEnv(options, seed)
    result = solve(env.level, time_limit=time_limit_s)
    if result.moves is None:
        raise ValueError(f"the solver could not solve level {seed} ({result.status})")
    observation, info = env.reset()
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": env.system_prompt},
        env.format_observation(observation),
    ]
    per_turn = options.max_actions_per_turn
    for start in range(0, len(result.moves), per_turn):
        moves = ", ".join(move.capitalize() for move in result.moves[start : start + per_turn])
        reply = f"<answer>{moves}</answer>"
        messages.append({"role": "assistant", "content": reply})
        step = env.step(reply)
        info = step.info
        if step.done:
            break
        messages.append(env.format_observation(step.observation))
    return {
        "episode_id": f"sokoban-demo-{seed}",
        "env": "sokoban",
        "seed": seed,
        "levels": [level_key(env.level)],
        "episode_reward": info.get("episode_reward", 0.0),
        "success": bool(info.get("success")),
        "messages": messages,
    }


def transcription(options: SokobanOptions, seed: int, system_prompt: bool = True) -> dict[str, Any]:
    """Level `seed` after 0-2 random moves as a conversation to imitate: the env's system prompt (unless
    `system_prompt` is false), the board's image alone (whatever `render_mode` says) with
    `TRANSCRIBE_INSTRUCTION`, and as the reply the board's text grid; `{episode_id, env, seed, levels,
    messages}`, messages holding a PIL image and `levels` the keys of the level and of the board shown."""
    env = SokobanEnv(options, seed)
    game = Game(env.level)
    moves = random.Random(seed)
    for _ in range(moves.randint(0, MAX_RANDOM_MOVES)):
        game.move(moves.choice(list(DIRECTIONS)))
    board = Level(env.level.grid, frozenset(game.boxes), game.player)
    image = render_image(board.grid, board.boxes, board.player, options.cell_size)
    text = f"[Observation]\n{IMAGE_HINT}\n{TRANSCRIBE_INSTRUCTION}"
    system = [{"role": "system", "content": env.system_prompt}] if system_prompt else []
    return {
        "episode_id": f"sokoban-board-{seed}",
        "env": "sokoban",
        "seed": seed,
        "levels": sorted({level_key(env.level), level_key(board)}),
        "messages": [
            *system,
            user_message({"images": [image], "text": text}),
            {"role": "assistant", "content": board.to_xsb()},
        ],
    }


def transcriptions(
    options: SokobanOptions,
    count: int,
    held_out: Set[str] = frozenset(),
    system_prompt: SystemPrompt = True,
    first_seed: int = TRANSCRIBE_FIRST_SEED,
) -> Iterator[dict[str, Any]]:
    """`count` boards to read (`transcription`, with or without the system prompt; `"alternate"`: the odd
    ones with it) from `first_seed` up, leaving out each board of a held-out level or that shows one
    (`held_out`: their keys); a `ValueError` once `MAX_SKIPPED_BOARDS` boards in a row are left out."""
    seeds = itertools.count(first_seed)
    for index in range(count):
        system = index % 2 == 1 if system_prompt == "alternate" else system_prompt
        for _ in range(MAX_SKIPPED_BOARDS):
            record = transcription(options, next(seeds), system)
            if held_out.isdisjoint(record["levels"]):
                yield record
                break
        else:
            raise ValueError(f"{MAX_SKIPPED_BOARDS} boards to read in a row show held-out levels")
