"""Expert demonstrations: the solver's optimal moves played through the env, as a chat conversation.

Each demonstration is what the policy should have said: the env's own system prompt, first observation
and feedback (rendered exactly as the env renders them), and replies in the seed's answer format with
up to `max_actions_per_turn` moves each. `vistarl sokoban demos` writes them for `vistarl sft`.
"""

from __future__ import annotations

from typing import Any

from vistarl.services.sokoban.env import SokobanEnv
from vistarl.services.sokoban.options import SokobanOptions
from vistarl.services.sokoban.solver import solve

__all__ = ["demonstration"]


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
