"""The in-process environment contract that every environment package implements.

An environment package (e.g. `vistarl.services.sokoban`) exposes `ENV_FACTORY: EnvFactory`, which the server
framework and the rollout loop use, and builds envs that subclass `Env` (docs/envs.md).

Observations in process are `{"text": str, "images": [PIL.Image]}`; the server encodes images to
data URLs at the boundary. `Env.step` returns a `StepResult`: the observation, the turn's `reward`, and
whether the episode is over, split as Gymnasium splits it: `terminated` (the episode reached an ending of
its own: solved, answered, given up) or `truncated` (a budget of the env ran out first, e.g. its turn or
move limit). The server sends the reward as `StepResponse.reward`, `done` as either, and `truncated`.

A task starts from a seed (generated tasks) or from a *sample*: one dataset row in the env's
`sample_model` schema, JSON-safe, images as PNG data URLs. The splits an env holds (`splits`) are
addressed by `/reset`'s `task_id` as `SPLIT/INDEX`; a row can also be sent whole as `sample`.
An env's whole state is JSON-safe data (`Env.state()`), from which `EnvFactory.restore` rebuilds
an env that continues the episode identically: any server replica can then serve any session.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import numbers
import random
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypedDict, TypeVar

from PIL import Image
from pydantic import BaseModel

OptionsT = TypeVar("OptionsT", bound=BaseModel)
SampleT = TypeVar("SampleT", bound=BaseModel)


class EnvObservation(TypedDict):
    text: str
    images: list[Image.Image]


@dataclass(frozen=True)
class StepResult:
    """One turn's outcome, with Gymnasium's names: the next observation, the turn reward, whether the
    episode ended by its own rules (`terminated`) or by a budget of the env (`truncated`), and the info.

    The info is the env's own JSON-safe extras (`metrics`, and `episode_end`'s `episode_reward` and
    `end_reward` on the last turn); the reward is never read from it. A reward that is not a finite
    number, or a flag that is not a bool, is a TypeError or ValueError here, where the env builds it,
    rather than a silent 0 later.
    """

    observation: EnvObservation
    reward: float
    terminated: bool
    truncated: bool = False
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.reward, bool) or not isinstance(self.reward, numbers.Real):
            raise TypeError(f"StepResult.reward must be a number, got {type(self.reward).__name__}")
        object.__setattr__(self, "reward", float(self.reward))
        if not math.isfinite(self.reward):
            raise ValueError(f"StepResult.reward must be finite, got {self.reward}")
        for name in ("terminated", "truncated"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"StepResult.{name} must be a bool, got {type(getattr(self, name)).__name__}")
        if not isinstance(self.info, dict):
            raise TypeError(f"StepResult.info must be a dict, got {type(self.info).__name__}")

    @property
    def done(self) -> bool:
        """Whether the episode is over, either way: no step may follow."""
        return self.terminated or self.truncated


def episode_end(episode_reward: float, turn_total: float) -> dict[str, float]:
    """The last turn's reward info: the env's `episode_reward`, and `end_reward`, the part of it that no
    turn reward carries (`episode_reward` minus `turn_total`, the sum of the episode's turn rewards, the
    last included), so that the turn rewards plus `end_reward` add up to the episode reward on every env
    (docs/envs.md, "Rewards")."""
    return {"episode_reward": episode_reward, "end_reward": episode_reward - turn_total}


def user_message(obs: EnvObservation) -> dict[str, Any]:
    """An OpenAI-style user message: one `image_url` part per image (PIL or data URL), then the text."""
    images = [{"type": "image_url", "image_url": {"url": image}} for image in obs["images"]]
    return {"role": "user", "content": [*images, {"type": "text", "text": obs["text"]}]}


class Env(ABC, Generic[OptionsT]):
    """One episode's worth of environment state: the base every env subclasses.

    An env writes `reset`, `step` and the episode's part of `state`; the base gives the defaults the
    envs share: the observation as a user message, nothing to close, and the options and seed that
    begin every state.
    """

    options: OptionsT
    """The env's validated options, an instance of its factory's `options_model`."""
    seed: int | None = None
    """The seed its task was generated from; None for a task given as a sample or fixed by the options."""

    @abstractmethod
    def reset(self) -> tuple[EnvObservation, dict[str, Any]]:
        """Start the episode; return the first observation and info."""

    @abstractmethod
    def step(self, response_text: str) -> StepResult:
        """Apply the model's full response: the next observation, the turn reward, and whether (and how)
        the episode ended."""

    def format_observation(self, obs: EnvObservation) -> dict[str, Any]:
        """Turn an observation into an OpenAI-style user message (images as PIL or data URLs)."""
        return user_message(obs)

    def close(self) -> None:
        """Release resources; safe to call twice. Nothing to release by default."""
        return None

    def state(self) -> dict[str, Any]:
        """The whole episode state as JSON-safe data; `EnvFactory.restore` rebuilds the env from it. This
        base part is the options as set and the seed: an env adds its episode's progress to it."""
        return {"options": self.options.model_dump(mode="json", exclude_unset=True), "seed": self.seed}


def checked_step(env: Env, response_text: str) -> StepResult:
    """`env.step(response_text)`, refusing anything but a `StepResult` with a TypeError that names the env
    and what it returned: an env that breaks the contract fails on its first step, not with a wrong score."""
    result = env.step(response_text)
    if not isinstance(result, StepResult):
        raise TypeError(
            f"{type(env).__name__}.step returned {type(result).__name__}, not a StepResult "
            "(observation, reward, terminated, truncated, info)"
        )
    return result


class TaskSplit(Protocol):
    """One split of tasks an env holds, addressed by `/reset`'s `task_id` as `SPLIT/INDEX`."""

    def __len__(self) -> int:
        """Rows in the split."""
        ...

    def __getitem__(self, index: int) -> dict[str, Any]:
        """Row `index` (0-based) as a JSON-safe sample of the env's `sample_model`."""
        ...


TOOL_CALL_BLOCK = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.DOTALL)
"""A `<tool_call>` block of a response, as `tool_call_markup` writes it; group 1 is its JSON object text."""


def tool_call_markup(name: str, arguments: Mapping[str, Any]) -> str:
    """The response text of a tool call in the `<tool_call>` form Qwen's chat templates write: the
    `tool_call_text` of an env whose own response format is that form (docs/agents.md)."""
    return f"<tool_call>{json.dumps({'name': name, 'arguments': dict(arguments)})}</tool_call>"


@dataclass(frozen=True)
class EpisodeScore:
    """A finished episode as a benchmark sees it: the env's text metrics, numeric metrics and reward."""

    labels: Mapping[str, str]
    metrics: Mapping[str, float]
    reward: float


@dataclass(frozen=True)
class GeneratedSplit:
    """A `TaskSplit` of `size` rows that `make_row(name, index)` builds when one is read, so a generated
    split costs nothing until used."""

    name: str
    size: int
    make_row: Callable[[str, int], dict[str, Any]]

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict[str, Any]:
        """Row `index` as a JSON-safe sample; IndexError outside 0..len-1."""
        if not 0 <= index < self.size:
            raise IndexError(f"{self.name} has rows 0..{self.size - 1}, not {index}")
        return self.make_row(self.name, index)


def check_steppable(started: bool, done: bool) -> None:
    """Refuse a `step` before `reset` or after the episode ended: the caller's mistake, named as such."""
    if not started:
        raise RuntimeError("call reset() before step()")
    if done:
        raise RuntimeError("the episode is over; call reset() to play again")


def no_splits() -> dict[str, TaskSplit]:
    """The `splits` of an env that holds no datasets."""
    return {}


def nothing_to_preload() -> None:
    """The `preload` of an env whose factory module already imports everything its envs need."""


@dataclass(frozen=True)
class EnvFactory:
    """Everything a server needs to host one environment: metadata plus a constructor.

    `options_model` validates the `options` of `/reset` (it should forbid unknown fields, so a
    typo is a 422 naming the field). `create(options, seed, sample)` builds a fresh env for a
    session from validated options and its task: a seed, or a row validated by `sample_model`
    (neither: the env picks a task itself).
    """

    name: str
    version: str
    description: str
    system_prompt: str
    action_format: str
    options_model: type[BaseModel]
    create: Callable[[BaseModel, int | None, BaseModel | None], Env]
    restore: Callable[[dict[str, Any]], Env]
    """Rebuild an env from what its `state()` returned."""
    sample_model: type[BaseModel] | None = None
    """Validates a dataset row given as `sample`; None when the env takes no samples."""
    splits: Callable[[], Mapping[str, TaskSplit]] = no_splits
    """The splits the env holds built in, by name; called once per process, on first use."""
    tools: list[dict[str, Any]] = field(default_factory=list)
    """The env's actions as OpenAI function-tool schemas, for chat-completion agents."""
    tool_aliases: Mapping[str, str] = field(default_factory=dict)
    """Other names a `/step` `tool_call` may give a tool by, each mapped to its name in `tools` (Geo3k's
    `calc_geo3k_reward` for `calc_score`); the call's text keeps the name it was given."""
    tool_call_text: Callable[[str, Mapping[str, Any]], str] = tool_call_markup
    """The response text that a call of one of `tools` stands for (its arguments already valid against
    the tool's schema); `/step` with a `tool_call` steps with it. A ValueError names what is wrong."""
    random_reply: Callable[[str, random.Random], str] | None = None
    """A baseline policy (`vistarl eval --dummy`): a random valid reply, given the conversation's text."""
    benchmark: Callable[[Sequence[EpisodeScore]], dict[str, float]] | None = None
    """How the env's benchmark turns finished episodes into its scores (VSI-Bench's per-task, overall)."""
    task_key: Callable[[BaseModel, int], str | None] | None = None
    """The identity of the task a seed gives under validated options (Sokoban's: the level's content), so
    that training skips the seeds whose task is a held-out seed's; None from an env whose seeds never
    repeat a task, and from the call when the options fix the task whatever the seed."""
    import_path: str | None = None
    """The module that defines this factory as `ENV_FACTORY` (`__name__` there), from which env worker
    processes load it; `load_env_factory` fills it in when a module leaves it out."""
    preload: Callable[[], None] = nothing_to_preload
    """Imports what `create` and `restore` import on their first call (Sokoban's renderer and numpy), so
    that a server whose envs run in worker processes never imports them; an env worker calls it before
    it says it has loaded the env."""

    def config_schema(self) -> dict[str, Any]:
        """The JSON schema of the env options, as published in `/info`."""
        return self.options_model.model_json_schema()


def checked_create(
    env_type: Callable[[OptionsT, int | None, SampleT | None], Env],
    options_model: type[OptionsT],
    sample_model: type[SampleT],
) -> Callable[[BaseModel, int | None, BaseModel | None], Env]:
    """An `EnvFactory.create` that builds `env_type(options, seed, sample)` once the options and the sample
    (if any) are checked to be of the env's own models; a TypeError names the model that was expected."""

    def create(options: BaseModel, seed: int | None, sample: BaseModel | None) -> Env:
        if not isinstance(options, options_model):
            raise TypeError(f"expected {options_model.__name__}, got {type(options).__name__}")
        if sample is not None and not isinstance(sample, sample_model):
            raise TypeError(f"expected a {sample_model.__name__} sample, got {type(sample).__name__}")
        return env_type(options, seed, sample)

    return create


ENV_MODULES: dict[str, str] = {  # a registered env's name, and the module whose ENV_FACTORY serves it
    "sokoban": "vistarl.services.sokoban",
    "vsi": "vistarl.services.vsi",
    "geo3k": "vistarl.services.geo3k",
}


def load_env_factory(name_or_module: str) -> EnvFactory:
    """Resolve a registered env name (`sokoban`) or an import path to its `ENV_FACTORY`."""
    module_path = ENV_MODULES.get(name_or_module, name_or_module)
    try:
        module = importlib.import_module(module_path)
    except ModuleNotFoundError as exc:
        if exc.name and not f"{module_path}.".startswith(f"{exc.name}."):
            extra = f": pip install 'vistarl[{name_or_module}]'" if name_or_module in ENV_MODULES else ""
            raise ValueError(
                f"environment {name_or_module!r} needs {exc.name!r}, which is not installed{extra}"
            ) from exc
        known = ", ".join(sorted(ENV_MODULES))
        raise ValueError(f"unknown environment {name_or_module!r} (known: {known})") from exc
    factory = getattr(module, "ENV_FACTORY", None)
    if not isinstance(factory, EnvFactory):
        raise ValueError(f"module {module_path!r} has no ENV_FACTORY of type EnvFactory")
    return factory if factory.import_path else dataclasses.replace(factory, import_path=module_path)
