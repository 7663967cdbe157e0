"""vistarl's envs as TRL `environment_factory` classes (`pip install 'vistarl[trl]'`; docs/trl.md).

TRL's `GRPOTrainer(environment_factory=...)` makes one instance per rollout (and reuses it across
batches) and drives it by duck typing; nothing here imports TRL:

- `reset(**row)` runs before generation with the columns of the rollout's dataset row; what it returns
  is appended to the prompt's last user message. Here it starts an episode on the env server from the
  row's `seed`, `task_id` or `sample` (`dataset` writes such rows) and returns the env's first message
  as content blocks, its images as PIL images, which TRL hands a VLM's processor.
- Every other public method is a tool: its name, type hints and Google-style docstring make the schema
  the model reads. Each one steps the episode with a call of the env's own tool (the `tools` of `/info`,
  which the server turns into the turn's response text) and returns the env's next message as content
  blocks, images as PIL, which TRL puts in the tool message and shows a VLM.
- `get_reward()`, called once a rollout is over, is the episode reward (`episode_reward`).

The instances share one `EnvClient` (thread-safe, one connection pool), which the caller opens and
shuts down. Torch-free, as all of `clients/`: `datasets` is imported by `dataset` alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Literal, TypedDict

from PIL import Image

from vistarl.clients.errors import ProtocolError
from vistarl.clients.http import EnvClient
from vistarl.clients.images import decode_image
from vistarl.clients.protocol import ImagePart, Message, StepResponse, ToolCall, episode_reward

if TYPE_CHECKING:
    from datasets import Dataset

__all__ = ["Block", "Geo3k", "Sokoban", "TRLEnv", "Vsi", "dataset"]

Move = Literal["Up", "Down", "Left", "Right"]


class Block(TypedDict, total=False):
    """A content block as TRL takes one: `{"type": "text", "text": ...}` or `{"type": "image", "image": ...}`
    with a PIL image. (A type that transformers cannot write as JSON, so a tool's schema has no return.)"""

    type: Literal["text", "image"]
    text: str
    image: Image.Image


class TRLEnv:
    """One env server's episodes, one at a time, for TRL: `reset`, `get_reward`, and a subclass's public
    methods as the tools. `options` are the env's options for every episode (a row's own update them).

    The latest episode's state stays readable: `session_id`, `images` (its latest message's, as PIL),
    `info`, `turn_rewards` and `done`.
    """

    _final_reply: str | None = None
    """The response text that ends an episode the model stopped playing, sent before its reward is read
    (Geo3k's turn without a tool call); None for an env where no reply does."""

    def __init__(self, client: EnvClient, options: Mapping[str, Any] | None = None) -> None:
        self.client = client
        self.options = dict(options or {})
        self.session_id: str | None = None
        self.images: list[Image.Image] = []
        self.info: dict[str, Any] = {}
        self.turn_rewards: list[float] = []
        self.done = False

    def reset(
        self,
        *,
        seed: int | None = None,
        task_id: str | None = None,
        sample: Mapping[str, Any] | None = None,
        options: Mapping[str, Any] | None = None,
        **row: Any,
    ) -> list[Block]:
        """Start an episode from the row's task (at most one of `seed`, `task_id` and `sample`; with none
        the env picks one), ending the one before; the env's first message. The row's other columns (its
        `prompt`) are TRL's."""
        self._end_session()
        start = self.client.reset(
            seed=seed,
            task_id=task_id,
            sample=sample,
            options={**self.options, **(options or {})},
            format=True,
        )
        self.session_id, self.info, self.turn_rewards, self.done = start.session_id, start.info, [], False
        return self._blocks(start.message)

    def get_reward(self) -> float:
        """The episode reward: the env's own `info["episode_reward"]` once the episode is over, else the sum
        of its turn rewards so far (`episode_reward`). The session ends here."""
        if self.session_id is not None and not self.done and self._final_reply is not None:
            self._record(self.client.step(self.session_id, self._final_reply, format=True))
        self._end_session()
        return episode_reward(self.turn_rewards, self.info)

    def _step(self, tool: str, **arguments: Any) -> list[Block]:
        """Play one turn as a call of the env's tool `tool`; the env's next message. A call the server
        refuses (an argument its schema rejects, a finished episode) raises with the server's reason,
        which TRL hands the model as the tool's result."""
        if self.session_id is None:
            raise RuntimeError("no episode is running: TRL calls reset() before the tools")
        answer = self.client.step(self.session_id, ToolCall(name=tool, arguments=arguments), format=True)
        self._record(answer)
        return self._blocks(answer.message)

    def _record(self, answer: StepResponse) -> None:
        """Keep a turn's reward, info and ending."""
        self.turn_rewards.append(answer.reward)
        self.info, self.done = answer.info, answer.done

    def _blocks(self, message: Message | None) -> list[Block]:
        """The env's chat message as TRL's content blocks, in the env's order, images decoded to PIL."""
        if message is None:
            raise ProtocolError("the env server sent no chat message for a call with format=true")
        if isinstance(message.content, str):
            self.images = []
            return [{"type": "text", "text": message.content}]
        blocks: list[Block] = [
            {"type": "image", "image": decode_image(part.image_url.url)}
            if isinstance(part, ImagePart)
            else {"type": "text", "text": part.text}
            for part in message.content
        ]
        self.images = [block["image"] for block in blocks if block["type"] == "image"]
        return blocks

    def _end_session(self) -> None:
        """Close the running episode's session, if any."""
        session_id, self.session_id = self.session_id, None
        if session_id is not None:
            self.client.close(session_id)


class Sokoban(TRLEnv):
    """Sokoban (docs/sokoban.md): one tool, `act`, a turn of moves."""

    def act(self, moves: list[Move]) -> list[Block]:
        """Take one turn: make these moves in order (up to the turn's limit, 3 by default; more are
        ignored). A move into a wall or a blocked push does nothing and is penalised.

        Args:
            moves: The moves, e.g. ["Up", "Left"].
        """
        return self._step("act", moves=moves)


class Geo3k(TRLEnv):
    """Geo3k (docs/geo3k.md): one tool, `calc_score`. TRL hands an env the model's tool calls, never its
    text, so the final answer graded is the last `calc_score` call's: the env's rule for a last reply
    without `\\boxed{}`, which `get_reward` sends (an empty reply ends a Geo3k episode)."""

    _final_reply = ""

    def calc_score(self, answer: str) -> list[Block]:
        r"""Check an answer to the geometry problem against the reference answer. Returns a score of 1.0
        if it matches, else 0.0.

        Args:
            answer: The answer: a number or a LaTeX expression such as 2\sqrt{3} or \frac{7}{2}, or the
                letter of a listed choice.
        """
        return self._step("calc_score", answer=answer)


class Vsi(TRLEnv):
    """VSI (docs/vsi.md): the camera's eight moves, each a turn that shows the new view, and `answer`."""

    def rotate_left(self) -> list[Block]:
        """Take one turn: turn 90° to the left; you then see the new view."""
        return self._step("rotate_left")

    def rotate_right(self) -> list[Block]:
        """Take one turn: turn 90° to the right; you then see the new view."""
        return self._step("rotate_right")

    def move_forward(self) -> list[Block]:
        """Take one turn: step 1 m forward; you then see the new view."""
        return self._step("move_forward")

    def move_backward(self) -> list[Block]:
        """Take one turn: step 1 m backward; you then see the new view."""
        return self._step("move_backward")

    def move_left(self) -> list[Block]:
        """Take one turn: step 0.5 m to the left; you then see the new view."""
        return self._step("move_left")

    def move_right(self) -> list[Block]:
        """Take one turn: step 0.5 m to the right; you then see the new view."""
        return self._step("move_right")

    def look_up(self) -> list[Block]:
        """Take one turn: tilt the view 15° up (at most 45°); you then see the new view."""
        return self._step("look_up")

    def look_down(self) -> list[Block]:
        """Take one turn: tilt the view 15° down (at most 45°); you then see the new view."""
        return self._step("look_down")

    def answer(self, answer: str) -> list[Block]:
        """Answer the question (a number, or an option's letter); this ends the episode.

        Args:
            answer: A number or an option letter.
        """
        return self._step("answer", answer=answer)


def dataset(
    client: EnvClient,
    *,
    seeds: Iterable[int] | None = None,
    task_ids: Iterable[str] | None = None,
    system_prompt: str | None = None,
) -> Dataset:
    """TRL's `train_dataset` for an env: a row per task (its `seed` or `task_id`, which `reset` starts),
    each prompting with `system_prompt`, by default the env's own (`/info`). GRPO plays each row
    `num_generations` times, so that a group plays one task; without a dataset each reset would draw its
    own."""
    from datasets import Dataset

    if (seeds is None) == (task_ids is None):
        raise ValueError("give the tasks as seeds or as task_ids, one of the two")
    tasks = (
        [{"seed": seed} for seed in seeds] if seeds is not None else [{"task_id": t} for t in task_ids or ()]
    )
    if not tasks:
        raise ValueError("the dataset needs at least one task")
    system = client.info().system_prompt if system_prompt is None else system_prompt
    prompt = [{"role": "system", "content": system}, {"role": "user", "content": ""}]
    return Dataset.from_list([{"prompt": prompt, **task} for task in tasks])
