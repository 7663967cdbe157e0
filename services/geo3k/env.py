"""The Geo3k environment behind the seeds' hooks: `build_env`, and `Geo3kEnv` with reset / step / format.

The first observation is the problem and its diagram. Each `step` reads the response's tool call
and answers with the seed's feedback (the step table of docs/geo3k.md); feedback is text only. The
episode ends on a turn without a valid tool call, after `max_turns` turns, or (with the vime fork's
`end_on_correct`) on a correct call. Its reward is binary, from the final answer: the last
`\\boxed{}` of the last response, else the answer of the last `calc_score` call, else 0. Only the
model's own responses are ever graded. Turn rewards are 0 except on the last turn, which carries the
episode reward; `info` has the per-turn tool scores and, every turn, the episode `metrics`.
"""

from __future__ import annotations

import enum
import secrets
from collections.abc import Mapping
from typing import Any

from PIL import Image
from pydantic import BaseModel, ConfigDict, Field

from vistarl.clients.images import decode_image
from vistarl.services.choices import choice_letter
from vistarl.services.env_api import Env, EnvObservation, StepResult, check_steppable, episode_end
from vistarl.services.geo3k import prompt
from vistarl.services.geo3k.answers import last_boxed
from vistarl.services.geo3k.generator import generate
from vistarl.services.geo3k.grader import GraderPool, Verdict, shared_pool
from vistarl.services.geo3k.options import Geo3kOptions
from vistarl.services.geo3k.sample import LETTERS, Geo3kSample
from vistarl.services.geo3k.tool_call import TOOL_NAMES, ToolCall, parse_tool_call


class Outcome(str, enum.Enum):
    """Which row of the step table a turn fell in."""

    NO_TOOL_CALL = "no_tool_call"
    UNSUPPORTED_TOOL = "unsupported_tool"
    MISSING_ANSWER = "missing_answer"
    CORRECT = "correct"
    WRONG = "wrong"
    RECORDED = "recorded"
    """A well-formed call under `calc_score: format`: its answer is recorded, not graded."""


class FinalSource(str, enum.Enum):
    """Where the graded final answer came from."""

    BOXED = "boxed"
    TOOL = "tool"
    NONE = "none"


class EpisodeState(BaseModel):
    """An episode's progress and counters: everything that changes as it is played."""

    model_config = ConfigDict(extra="forbid")

    started: bool = False
    done: bool = False
    turn: int = 0
    tool_scores: list[float | None] = Field(default_factory=list)
    last_tool_answer: str | None = None
    last_tool_score: float | None = None
    tool_calls: int = 0
    correct_calls: int = 0
    grade_timeouts: int = 0
    grade_failures: int = 0
    episode_reward: float | None = None
    final_answer: str | None = None
    final_source: FinalSource | None = None


class Geo3kEnv(Env[Geo3kOptions]):
    """One geometry problem, played as an episode of tool calls that `reset()` restarts."""

    def __init__(
        self,
        options: Geo3kOptions | None = None,
        seed: int | None = None,
        sample: Geo3kSample | None = None,
        grader: GraderPool | None = None,
    ) -> None:
        """The problem of `sample`, else the generated problem of `seed` (drawn at random when None)."""
        if seed is not None and sample is not None:
            raise ValueError("give a seed (a generated problem) or a sample, not both")
        self.options = options or Geo3kOptions()
        self.grader = grader or shared_pool()
        self.grader.warm()
        self.sample = sample
        self.seed: int | None = None
        self.images: list[Image.Image]
        if sample is not None:
            self.problem, self.answer, self.choices = sample.problem, sample.answer, sample.choices
            self.id = sample.id
            self.images = [decode_image(url) for url in sample.images]
        else:
            self.seed = seed if seed is not None else secrets.randbelow(2**31)
            generated = generate(self.seed)
            self.problem, self.answer, self.choices = generated.problem, generated.answer, generated.choices
            self.id = generated.id
            self.images = [generated.image]
        self.episode = EpisodeState()

    @property
    def system_prompt(self) -> str:
        """The system prompt (the same for every option)."""
        return prompt.SYSTEM_PROMPT

    @property
    def done(self) -> bool:
        """True once the episode has ended."""
        return self.episode.done

    @property
    def shown_letters(self) -> str:
        """The choice letters the model sees (none when choices are absent or hidden)."""
        return LETTERS[: len(self.choices)] if self.choices and self.options.show_choices else ""

    def reset(self) -> tuple[EnvObservation, dict[str, Any]]:
        """Restart the episode; info names the problem (never its answer)."""
        self.episode = EpisodeState(started=True)
        shown = self.choices if self.shown_letters else None
        info = {
            "id": self.id,
            "seed": self.seed,
            "multiple_choice": bool(shown),
            "max_turns": self.options.max_turns,
        }
        return {"text": prompt.problem_text(self.problem, shown), "images": list(self.images)}, info

    def step(self, response_text: str) -> StepResult:
        """Answer one response by the step table. The turn reward is 0 but on the last turn, which carries
        the episode reward; `max_turns` spent truncates the episode, any other ending terminates it."""
        episode = self.episode
        check_steppable(episode.started, episode.done)
        episode.turn += 1
        call = parse_tool_call(response_text)
        outcome, feedback, score = self._answer(call)
        episode.tool_scores.append(score)
        terminated = outcome is Outcome.NO_TOOL_CALL or (
            outcome is Outcome.CORRECT and self.options.end_on_correct
        )
        truncated = not terminated and episode.turn >= self.options.max_turns
        episode.done = terminated or truncated
        info: dict[str, Any] = {
            "turn": episode.turn,
            "outcome": outcome.value,
            "tool_call": None if call is None else {"name": call.name, "answer": call.answer},
            "tool_score": score,
            "tool_scores": list(episode.tool_scores),
        }
        reward = 0.0
        if episode.done:
            reward = self._finish(response_text)
            info.update(episode_end(reward, reward))  # the turns before this one carried 0
            info["final_answer"] = episode.final_answer
            info["final_answer_source"] = episode.final_source.value if episode.final_source else None
        info["metrics"] = self.metrics()
        return StepResult({"text": feedback, "images": []}, reward, terminated, truncated, info)

    def metrics(self) -> dict[str, Any]:
        """Episode metrics so far, all numbers: success, turns, tool calls, correct calls, grading timeouts
        and failures, and whether the final answer came from a `\\boxed{}`."""
        episode = self.episode
        return {
            "success": episode.episode_reward == 1.0,
            "turns": episode.turn,
            "tool_calls": episode.tool_calls,
            "correct_tool_calls": episode.correct_calls,
            "grade_timeouts": episode.grade_timeouts,
            "grade_failures": episode.grade_failures,
            "boxed_final_answer": episode.final_source is FinalSource.BOXED,
        }

    def state(self) -> dict[str, Any]:
        """Everything `from_state` needs: options, the task (its seed, or the whole sample), the episode."""
        return {
            **super().state(),
            "sample": None if self.sample is None else self.sample.model_dump(mode="json"),
            "episode": self.episode.model_dump(mode="json"),
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> Geo3kEnv:
        """The env `state()` described, continuing where it stopped."""
        options = Geo3kOptions.model_validate(state["options"])
        sample = None if state["sample"] is None else Geo3kSample.model_validate(state["sample"])
        env = cls(options, state["seed"] if sample is None else None, sample)
        env.episode = EpisodeState.model_validate(state["episode"])
        return env

    def _answer(self, call: ToolCall | None) -> tuple[Outcome, str, float | None]:
        """The step-table row of a turn's call: its outcome, feedback text and tool score (None: not run)."""
        if call is None:
            return Outcome.NO_TOOL_CALL, prompt.NO_TOOL_CALL, None
        if call.name not in TOOL_NAMES:
            return Outcome.UNSUPPORTED_TOOL, prompt.unsupported_tool(call.name), None
        if not call.answer.strip():
            return Outcome.MISSING_ANSWER, prompt.missing_answer(), None
        episode = self.episode
        episode.tool_calls += 1
        last_chance = episode.turn - 1 >= max(self.options.max_turns - 2, 0)
        if self.options.calc_score == "format":
            episode.last_tool_answer, episode.last_tool_score = call.answer, None
            return Outcome.RECORDED, prompt.recorded_answer(call.answer, last_chance), None
        verdict = self._grade(call.answer)
        episode.last_tool_answer, episode.last_tool_score = call.answer, verdict.score
        if verdict is Verdict.CORRECT:
            episode.correct_calls += 1
            return Outcome.CORRECT, prompt.correct_answer(call.answer), verdict.score
        return Outcome.WRONG, prompt.wrong_answer(call.answer, last_chance), verdict.score

    def _finish(self, response_text: str) -> float:
        """Grade the final answer (the last response's `\\boxed{}`, else the last tool answer); the reward."""
        episode = self.episode
        boxed = last_boxed(response_text)
        if boxed is not None and boxed.strip():
            source, answer = FinalSource.BOXED, boxed
            reuse = (
                episode.last_tool_score is not None
                and boxed.strip() == (episode.last_tool_answer or "").strip()
            )
            score = episode.last_tool_score if reuse else self._grade(boxed).score
        elif episode.last_tool_answer is not None:
            source, answer, score = FinalSource.TOOL, episode.last_tool_answer, episode.last_tool_score
            if score is None:  # recorded under `calc_score: format`, graded only now
                score = self._grade(answer).score
        else:
            source, answer, score = FinalSource.NONE, None, 0.0
        episode.final_source, episode.final_answer = source, answer
        episode.episode_reward = float(score or 0.0)
        return episode.episode_reward

    def _grade(self, candidate: str) -> Verdict:
        """A choice letter (when choices are shown) by its letter, anything else by math-verify within the
        grading timeout; timeouts and failures are counted."""
        letter = choice_letter(candidate, self.shown_letters) if self.shown_letters else None
        if letter is not None:
            assert self.choices is not None
            return Verdict.CORRECT if self.choices[LETTERS.index(letter)] == self.answer else Verdict.WRONG
        verdict = self.grader.grade(candidate, self.answer, self.options.grade_timeout_s)
        self.episode.grade_timeouts += verdict is Verdict.TIMEOUT
        self.episode.grade_failures += verdict is Verdict.FAILED
        return verdict


def build_env(sample: Any = None, args: Any = None, seed: int | None = None, **config: Any) -> Geo3kEnv:
    """The seeds' hook: an env for a dataset row (a mapping in the sample schema, or a `Geo3kSample`), else
    for the generated problem of `seed` (random when None). `config` holds env options; `args.max_turns`
    (the trainer's arguments in the seeds) is the default number of turns."""
    max_turns = getattr(args, "max_turns", None)
    options = Geo3kOptions.model_validate({**({"max_turns": max_turns} if max_turns else {}), **config})
    if sample is None or isinstance(sample, Geo3kSample):
        return Geo3kEnv(options, seed, sample)
    if not isinstance(sample, Mapping):
        raise TypeError(f"sample must be a mapping in the Geo3k sample schema, got {type(sample).__name__}")
    return Geo3kEnv(options, seed, Geo3kSample.model_validate(dict(sample)))
