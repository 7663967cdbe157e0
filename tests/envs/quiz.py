"""A test environment that starts from dataset rows: answer the question a sample asks about its image.

Loaded by import path (`load_env_factory("tests.envs.quiz")`). A sample (`QuizSample`) is a question, its
answer, images as PNG data URLs and an optional id. The built-in splits `train` and `test` are rows made
by `quiz_row(split, index)`, so tests compute what a task must show instead of copying it. A step that
sends the answer ends the episode with reward 1; a wrong one scores 0 and ends it after `max_turns`. A
reset with a seed (or nothing) plays row `seed` of `train`. `/info` lists the one tool, `answer`.
"""

from __future__ import annotations

import random
from typing import Any

from PIL import Image
from pydantic import BaseModel, ConfigDict, Field

from vistarl.clients.images import decode_image, encode_image
from vistarl.services.env_api import Env, EnvFactory, EnvObservation, GeneratedSplit, StepResult, TaskSplit

SPLIT_SIZES = {"train": 12, "test": 5}
ANSWER_TOOL = {
    "type": "function",
    "function": {
        "name": "answer",
        "description": "Give the answer to the question.",
        "parameters": {
            "type": "object",
            "properties": {"answer": {"type": "string", "description": "The answer."}},
            "required": ["answer"],
        },
    },
}


class QuizSample(BaseModel):
    """One row: a question about its images, and the answer that ends the episode."""

    model_config = ConfigDict(extra="forbid")

    question: str = Field(min_length=1)
    answer: str
    images: list[str] = Field(default_factory=list)
    id: str | None = None


class QuizOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_turns: int = Field(default=2, ge=1, le=10, description="Wrong answers before the episode ends.")


def quiz_row(split: str, index: int) -> dict[str, Any]:
    """Row `index` of a built-in split, as JSON: a sum to work out, its terms drawn in the image's colour."""
    rng = random.Random(f"{split}/{index}")
    a, b = rng.randrange(100), rng.randrange(100)
    image = Image.new("RGB", (4, 4), (a, b, 0))
    return {
        "question": f"What is {a} + {b}?",
        "answer": str(a + b),
        "images": [encode_image(image)],
        "id": f"{split}/{index}",
    }


def quiz_splits() -> dict[str, TaskSplit]:
    return {name: GeneratedSplit(name, size, quiz_row) for name, size in SPLIT_SIZES.items()}


class QuizEnv(Env[QuizOptions]):
    """Asks the sample's question until it is answered or `max_turns` wrong answers are given."""

    def __init__(self, options: QuizOptions, sample: QuizSample, turns: int = 0) -> None:
        self.options = options
        self.sample = sample
        self.turns = turns

    def reset(self) -> tuple[EnvObservation, dict[str, Any]]:
        self.turns = 0
        return self._observe(), {"id": self.sample.id}

    def step(self, response_text: str) -> StepResult:
        self.turns += 1
        right = response_text.strip() == self.sample.answer
        truncated = not right and self.turns >= self.options.max_turns
        info: dict[str, Any] = {"episode_reward": float(right)} if right or truncated else {}
        return StepResult(self._observe(), float(right), terminated=right, truncated=truncated, info=info)

    def format_observation(self, obs: EnvObservation) -> dict[str, Any]:
        images = [{"type": "image", "image": image} for image in obs["images"]]
        return {"role": "user", "content": [*images, {"type": "text", "text": obs["text"]}]}

    def state(self) -> dict[str, Any]:
        return {**super().state(), "sample": self.sample.model_dump(), "turns": self.turns}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> QuizEnv:
        options, sample = (
            QuizOptions.model_validate(state["options"]),
            QuizSample.model_validate(state["sample"]),
        )
        return cls(options, sample, state["turns"])

    def _observe(self) -> EnvObservation:
        images = [decode_image(url) for url in self.sample.images]
        return EnvObservation(text=f"{self.sample.question} (turn {self.turns})", images=images)


def _create(options: BaseModel, seed: int | None, sample: BaseModel | None) -> QuizEnv:
    assert isinstance(options, QuizOptions)
    if sample is None:
        sample = QuizSample.model_validate(quiz_row("train", (seed or 0) % SPLIT_SIZES["train"]))
    assert isinstance(sample, QuizSample)
    return QuizEnv(options, sample)


ENV_FACTORY = EnvFactory(
    name="quiz",
    version="1.0",
    create=_create,
    restore=QuizEnv.from_state,
    options_model=QuizOptions,
    sample_model=QuizSample,
    splits=quiz_splits,
    tools=[ANSWER_TOOL],
    description="Answer the question of a dataset row.",
    system_prompt="Answer the question about the image.",
    action_format="the answer",
)
