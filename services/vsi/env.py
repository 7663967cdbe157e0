"""The VSI environment behind the seeds' hooks: `build_env`, and `VsiEnv` with reset / step / format.

An episode is one question about one room. Reset shows the question, the scripted tour's frames and the
first view; each turn is one action (a new view) or the answer, which ends the episode with VSI-Bench's
score as the reward (`scoring.py`). After `max_turns` turns without an answer the episode is truncated,
with reward 0. Optional shaping adds `coverage_reward` times each turn's gain in the
fraction of the room's objects seen in the agent's own views.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray

from vistarl.services.env_api import Env, EnvObservation, StepResult, check_steppable, episode_end
from vistarl.services.vsi.appearance import VISIBLE_FRACTION
from vistarl.services.vsi.camera import Pose, apply_action, start_pose, tour_poses
from vistarl.services.vsi.catalog import get_scene
from vistarl.services.vsi.generator import generate_question
from vistarl.services.vsi.options import VsiOptions
from vistarl.services.vsi.prompt import reset_text, system_prompt, turn_text
from vistarl.services.vsi.question import VsiQuestion
from vistarl.services.vsi.render import render_frames, visible_pixels
from vistarl.services.vsi.responses import parse_turn
from vistarl.services.vsi.scoring import read_answer, score_answer


class VsiEnv(Env[VsiOptions]):
    """One question in one room, played as an episode that `reset()` restarts from the start pose."""

    pose: Pose
    turns: int
    seen: set[int]
    turn_rewards: list[float]
    score: float | None
    answer: str | None
    valid_actions: int
    blocked_moves: int
    _done: bool
    _truncated: bool

    def __init__(
        self, options: VsiOptions | None = None, seed: int | None = None, question: VsiQuestion | None = None
    ) -> None:
        """Fix the question now: `question` (a dataset row), or the one generated from `seed`, `options.seed`
        or a random seed within the options' scene and type."""
        self.options = options or VsiOptions()
        self.seed: int | None = None
        if question is None:
            self.seed = seed if seed is not None else self.options.seed
            if self.seed is None:
                self.seed = secrets.randbelow(2**31)
            question = generate_question(
                self.seed, self.options.scene_set, self.options.scene_name, self.options.question_type
            )
        else:
            _check_matches(question, self.options)
        self.question = question
        self.scene = get_scene(question.scene_name)
        self._started = False
        self._new_episode()

    @property
    def system_prompt(self) -> str:
        """The system prompt for this env's turn budget."""
        return system_prompt(self.options.max_turns)

    def reset(self) -> tuple[EnvObservation, dict[str, Any]]:
        """Back to the start pose; the observation has the question, the tour frames and the first view."""
        self._new_episode()
        self._started = True
        tour = tour_poses(self.scene) if self.options.show_tour else []
        frames = render_frames(self.scene, [*tour, self.pose], self.options.image_size, self.options.labels)
        self._see(frames[-1].ids)
        info = {
            "scene_name": self.scene.name,
            "dataset": self.scene.dataset,
            "question_type": self.question.question_type.value,
            "question_id": self.question.id,
            "seed": self.seed,
            "max_turns": self.options.max_turns,
            "tour_frames": len(tour),
        }
        text = reset_text(self.question, len(tour), self.options.max_turns)
        return {"text": text, "images": [frame.image for frame in frames]}, info

    def step(self, response_text: str) -> StepResult:
        """Play one turn of a response: an answer terminates the episode, `max_turns` without one
        truncates it."""
        check_steppable(self._started, self._done)
        self.turns += 1
        turn = parse_turn(response_text)
        reward, blocked = 0.0, False
        if turn.answer is not None:
            self.answer = read_answer(self.question.question_type, turn.answer)
            self.score = score_answer(self.question.question_type, self.question.ground_truth, turn.answer)
            reward, feedback = self.score, f"You answered {self.answer!r}. The episode is over."
            self._done = True
        elif turn.action is not None:
            self.valid_actions += 1
            moved = apply_action(self.scene, self.pose, turn.action)
            blocked = moved.blocked
            self.blocked_moves += blocked
            self.pose = moved.pose
            feedback = moved.feedback(turn.action)
        else:
            feedback = f"Invalid response: {turn.problem}. Nothing happened."
        frame = render_frames(self.scene, [self.pose], self.options.image_size, self.options.labels)[0]
        if not self._done:
            reward += self.options.coverage_reward * self._see(frame.ids)
            if self.turns >= self.options.max_turns:
                self._done = self._truncated = True
                feedback += " You are out of turns without an answer: the score is 0."
        self.turn_rewards.append(reward)
        info: dict[str, Any] = {
            "action": turn.action.value if turn.action is not None else None,
            "action_is_valid": turn.problem is None,
            "blocked": blocked,
            "pose": self.pose.to_list(),
            "metrics": self.metrics(),
        }
        if self._done:
            total = sum(self.turn_rewards)
            info.update(episode_end(total, total))
        turns_left = self.options.max_turns - self.turns
        observation: EnvObservation = {"text": turn_text(feedback, turns_left), "images": [frame.image]}
        terminated = self._done and not self._truncated
        return StepResult(observation, reward, terminated, self._truncated, info)

    def metrics(self) -> dict[str, Any]:
        """Episode metrics so far: score, question type, turns, coverage and action counts."""
        return {
            "score": self.score if self.score is not None else 0.0,
            "answered": self.score is not None,
            "truncated": self._truncated,
            "question_type": self.question.question_type.value,
            "turns": self.turns,
            "coverage": len(self.seen) / len(self.scene.objects),
            "valid_actions": self.valid_actions,
            "blocked_moves": self.blocked_moves,
        }

    def state(self) -> dict[str, Any]:
        """Everything `from_state` needs to continue this episode: options, question, pose, counters."""
        return {
            **super().state(),
            "question": self.question.model_dump(mode="json"),
            "started": self._started,
            "done": self._done,
            "truncated": self._truncated,
            "pose": self.pose.to_list(),
            "turns": self.turns,
            "seen": sorted(self.seen),
            "turn_rewards": list(self.turn_rewards),
            "score": self.score,
            "answer": self.answer,
            "valid_actions": self.valid_actions,
            "blocked_moves": self.blocked_moves,
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> VsiEnv:
        """The env `state()` described, continuing where it stopped (no question is generated again)."""
        env = cls(
            VsiOptions.model_validate(state["options"]),
            question=VsiQuestion.model_validate(state["question"]),
        )
        env.seed = state["seed"]
        env._started = bool(state["started"])
        env._done = bool(state["done"])
        env._truncated = bool(state["truncated"])
        env.pose = Pose.from_list(state["pose"])
        env.turns = int(state["turns"])
        env.seen = {int(i) for i in state["seen"]}
        env.turn_rewards = [float(r) for r in state["turn_rewards"]]
        env.score = None if state["score"] is None else float(state["score"])
        env.answer = state["answer"]
        env.valid_actions = int(state["valid_actions"])
        env.blocked_moves = int(state["blocked_moves"])
        return env

    def _new_episode(self) -> None:
        """Back to the start pose with the episode's counters at zero."""
        self.pose = start_pose(self.scene)
        self.turns = self.valid_actions = self.blocked_moves = 0
        self.seen = set()
        self.turn_rewards = []
        self.score = self.answer = None
        self._done = self._truncated = False

    def _see(self, ids: NDArray[np.int32]) -> float:
        """Add the objects visible in a view's id buffer to those seen; the gain in coverage."""
        before = len(self.seen)
        counts = visible_pixels(ids, len(self.scene.objects))
        self.seen.update(int(i) for i in (counts >= VISIBLE_FRACTION * ids.size).nonzero()[0])
        return (len(self.seen) - before) / len(self.scene.objects)


def _check_matches(question: VsiQuestion, options: VsiOptions) -> None:
    """Options that pick a question may accompany a given one only if they describe it."""
    if options.scene_name is not None and options.scene_name != question.scene_name:
        raise ValueError(
            f"scene_name: {options.scene_name!r} does not match the question's {question.scene_name!r}"
        )
    if options.question_type is not None and options.question_type != question.question_type:
        raise ValueError(
            f"question_type: {options.question_type.value!r} does not match the question's "
            f"{question.question_type.value!r}"
        )


def build_env(sample: Any = None, args: Any = None, **config: Any) -> VsiEnv:
    """The seeds' hook: an env for a question row (`sample`, the `VsiQuestion` schema) or, without one, for
    the question generated from `config` (`VsiOptions`); `args` is not needed here."""
    options = VsiOptions.model_validate(config)
    if sample is None:
        return VsiEnv(options)
    question = sample if isinstance(sample, VsiQuestion) else VsiQuestion.model_validate(dict(sample))
    return VsiEnv(options, question=question)
