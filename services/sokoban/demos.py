"""Expert demonstrations: the solver's optimal moves played through the env, as a chat conversation; and
boards to read, the image in and its text grid out.

Each demonstration is what the policy should have said: the env's own system prompt, first observation
and feedback (rendered exactly as the env renders them), and replies in the seed's answer format with
up to `max_actions_per_turn` moves each. `vistarl sokoban demos` writes them for `vistarl sft`.

A transcription (`transcription`) teaches the policy to see the board before it plays: the same system
prompt and image as an episode's, an instruction to write the board down, and as the reply the board's
text grid (XSB), which the image alone shows. `vistarl demo learn` writes `sft.transcribe_boards` of them
for SFT's reading stage (`sft.transcribe_data`, docs/results.md).
"""

from __future__ import annotations

import random
from typing import Any

from vistarl.services.env_api import user_message
from vistarl.services.sokoban.env import SokobanEnv
from vistarl.services.sokoban.game import DIRECTIONS, Game
from vistarl.services.sokoban.options import SokobanOptions
from vistarl.services.sokoban.prompt import IMAGE_HINT
from vistarl.services.sokoban.render import render_image
from vistarl.services.sokoban.solver import solve

__all__ = ["TRANSCRIBE_FIRST_SEED", "TRANSCRIBE_INSTRUCTION", "demonstration", "transcription"]

TRANSCRIBE_INSTRUCTION = "Write the board as a text grid, one line per row."
TRANSCRIBE_FIRST_SEED = 1_000_000  # above the demonstrations' seeds and both held-out sets
MAX_RANDOM_MOVES = 2  # a board is a level's start or a state a few moves in, as later turns show them


def demonstration(options: SokobanOptions, seed: int, time_limit_s: float = 10.0) -> dict[str, Any]:
    """The solved episode of level `seed` as `{episode_id, env, seed, episode_reward, success, messages}`;
    messages hold PIL images, which the caller encodes. Raises `ValueError` if the solver gives up."""
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
        "episode_reward": info.get("episode_reward", 0.0),
        "success": bool(info.get("success")),
        "messages": messages,
    }


def transcription(options: SokobanOptions, seed: int) -> dict[str, Any]:
    """Level `seed` after 0-2 random moves as a conversation to imitate: the env's system prompt, the
    board's image alone (whatever `render_mode` says) with `TRANSCRIBE_INSTRUCTION`, and as the reply
    the board's text grid; `{episode_id, env, seed, messages}`, messages holding a PIL image."""
    env = SokobanEnv(options, seed)
    game = Game(env.level)
    moves = random.Random(seed)
    for _ in range(moves.randint(0, MAX_RANDOM_MOVES)):
        game.move(moves.choice(list(DIRECTIONS)))
    image = render_image(env.level.grid, game.boxes, game.player, options.cell_size)
    text = f"[Observation]\n{IMAGE_HINT}\n{TRANSCRIBE_INSTRUCTION}"
    return {
        "episode_id": f"sokoban-board-{seed}",
        "env": "sokoban",
        "seed": seed,
        "messages": [
            {"role": "system", "content": env.system_prompt},
            user_message({"images": [image], "text": text}),
            {"role": "assistant", "content": game.to_xsb()},
        ],
    }
