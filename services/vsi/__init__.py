"""The VSI environment (seed: vagen_vsi_rl): VSI-Bench's spatial questions, answered by exploring rendered
rooms. Python API and server factory."""

from __future__ import annotations

from vistarl.services.env_api import EnvFactory, checked_create
from vistarl.services.vsi.env import VsiEnv, build_env
from vistarl.services.vsi.options import VsiOptions
from vistarl.services.vsi.policy import benchmark, random_reply
from vistarl.services.vsi.prompt import ACTION_FORMAT, system_prompt
from vistarl.services.vsi.question import VsiQuestion
from vistarl.services.vsi.splits import splits
from vistarl.services.vsi.tools import TOOLS, tool_call_text

__all__ = ["ENV_FACTORY", "VsiEnv", "VsiOptions", "VsiQuestion", "build_env"]


ENV_FACTORY = EnvFactory(
    name="vsi",
    version="1.0.0",
    description=(
        "VSI-Bench spatial questions (8 tasks) in rendered rooms: the 288 VSI-Bench layouts (test) or "
        "synthetic rooms (train). Reset shows a tour of the room and the first view; each turn is one move "
        "(<action>NAME</action>) or the answer (<answer>X</answer>), scored by MRA or exact letter."
    ),
    options_model=VsiOptions,
    sample_model=VsiQuestion,
    create=checked_create(VsiEnv, VsiOptions, VsiQuestion),
    restore=VsiEnv.from_state,
    system_prompt=system_prompt(),
    action_format=ACTION_FORMAT,
    splits=splits,
    tools=TOOLS,
    random_reply=random_reply,
    benchmark=benchmark,
    tool_call_text=tool_call_text,
    import_path=__name__,
)
