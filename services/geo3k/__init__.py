"""The Geo3k environment (seed: slime's "VLM multi-turn, geo3k"): Python API and server factory."""

from __future__ import annotations

from typing import Any

from vistarl.services.env_api import EnvFactory, checked_create
from vistarl.services.geo3k.env import Geo3kEnv, build_env
from vistarl.services.geo3k.options import Geo3kOptions
from vistarl.services.geo3k.prompt import ACTION_FORMAT, SYSTEM_PROMPT, random_reply
from vistarl.services.geo3k.sample import Geo3kSample
from vistarl.services.geo3k.splits import builtin_splits
from vistarl.services.geo3k.tool_call import TOOL_NAMES

__all__ = ["ENV_FACTORY", "TOOLS", "Geo3kEnv", "Geo3kOptions", "Geo3kSample", "build_env"]

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "calc_score",
            "description": (
                "Check an answer to the geometry problem against the reference answer. "
                "Returns a score of 1.0 if it matches, else 0.0."
            ),
            "parameters": {
                "type": "object",
                "properties": {
                    "answer": {
                        "type": "string",
                        "description": (
                            "The answer: a number or a LaTeX expression such as 2\\sqrt{3} or \\frac{7}{2}, "
                            "or the letter of a listed choice."
                        ),
                    }
                },
                "required": ["answer"],
            },
        },
    }
]


ENV_FACTORY = EnvFactory(
    name="geo3k",
    version="1.0.0",
    description=(
        "Geo3k (seed rules): solve a geometry problem from its diagram, check answers with the calc_score "
        "tool, and give the final answer in \\boxed{}; the reward is 1 for a correct final answer. Problems "
        "come from a seed (built-in generator), a dataset row (Geometry3K schema), or the train/test splits."
    ),
    system_prompt=SYSTEM_PROMPT,
    action_format=ACTION_FORMAT,
    options_model=Geo3kOptions,
    create=checked_create(Geo3kEnv, Geo3kOptions, Geo3kSample),
    restore=Geo3kEnv.from_state,
    sample_model=Geo3kSample,
    splits=builtin_splits,
    tools=TOOLS,
    tool_aliases={alias: TOOL_NAMES[0] for alias in TOOL_NAMES[1:]},
    random_reply=random_reply,
    import_path=__name__,
)
