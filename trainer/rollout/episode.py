"""The episode loop: drive a generation engine against an environment and return a token-exact trajectory.

`run_episode(env, engine, processor, job)` resets the env, builds the prompt (system prompt, first
observation), then repeats, as the job's settings say: generate from `engine_ids` with every image so far,
append the generated ids verbatim, step the env with the decoded text, append the next observation as a
masked delta. It ends when the env ends the episode (COMPLETED), when a budget cuts it (the env's own limit,
`max_turns` or a token budget: TRUNCATED) or on a finish reason other than `stop`, and never raises
except on cancellation: every failure becomes a status with its error. The trajectory carries the
settings' `Behaviour` (the sampling the learner scores it with). The status table, budgets and reward
functions are described in docs/rollout.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from vistarl.trainer.rollout.engines.base import Engine, GenerateRequest, GenerateResult, policy_version_of
from vistarl.trainer.rollout.episode_env import EnvError, EpisodeEnv, opening_messages
from vistarl.trainer.rollout.job import EpisodeJob, EpisodeSettings
from vistarl.trainer.rollout.processor import VLProcessor
from vistarl.trainer.rollout.rewards import RewardFn, env_reward
from vistarl.trainer.rollout.tokenization import TokenTrackError, TokenTracks, TurnEncoder
from vistarl.trainer.rollout.trajectory import Status, Trajectory

__all__ = ["failed_trajectory", "run_episode"]

log = logging.getLogger(__name__)

T = TypeVar("T")

ENGINE_ABORT_TIMEOUT_S = 5.0


class _Ended(Exception):
    """Ends an episode early with a status; the message is the reason for it."""

    def __init__(self, status: Status, error: str) -> None:
        super().__init__(error)
        self.status = status


@dataclass(eq=False)
class _Episode:
    """One running episode: its token tracks, env rewards and info, finish reasons and timings."""

    env: EpisodeEnv
    engine: Engine
    encoder: TurnEncoder
    settings: EpisodeSettings
    session: str
    tracks: TokenTracks = field(init=False)
    turn_rewards: list[float] = field(default_factory=list, init=False)
    info: dict[str, Any] = field(default_factory=dict, init=False)
    finishes: Counter[str] = field(default_factory=Counter, init=False)
    versions: list[str] = field(default_factory=list, init=False)
    timings: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float), init=False)

    def __post_init__(self) -> None:
        self.tracks = TokenTracks(self.encoder)

    async def play(self, job: EpisodeJob) -> Status:
        """Reset, then take turns until an ending; an early ending raises `_Ended`."""
        message, self.info = await self._timed_env(self.env.reset(job), "env_reset")
        with self._timer("tokenize"):
            self.tracks.add_prompt(opening_messages(self.env, message))
        while True:
            text = await self._generate()
            message, answer = await self._timed_env(self.env.step(text))
            self.info = answer.info
            if not math.isfinite(answer.reward):
                raise EnvError(f"env step returned a non-finite reward: {answer.reward}")
            self.turn_rewards.append(answer.reward)
            if answer.terminated:
                return Status.COMPLETED
            if answer.truncated:
                raise _Ended(Status.TRUNCATED, "the env's own limit ended the episode")
            if len(self.turn_rewards) == self.settings.max_turns:
                raise _Ended(Status.TRUNCATED, f"the turn budget of {self.settings.max_turns} turns is spent")
            if self.tracks.num_generated >= self.settings.rollout_max_response_len:
                raise self._spent("generated-token", self.settings.rollout_max_response_len)
            with self._timer("tokenize"):
                self.tracks.add_observation(message)

    async def _generate(self) -> str:
        """One generation within the budgets, appended verbatim; returns the reply text for the env."""
        limit = self._token_limit()
        request = GenerateRequest(
            engine_ids=list(self.tracks.engine_ids),
            images=list(self.tracks.images),
            sampling=self.settings.sampling.model_copy(update={"max_new_tokens": limit}),
            session=self.session,
        )
        with self._timer("generate"):
            result = await _generate(self.engine, request)
        self.finishes[result.finish_reason.type] += 1
        if result.aborted:
            reason = result.finish_reason.message or "no reason given"
            raise _Ended(Status.ABORTED, f"engine aborted: {reason}")
        self.versions.append(result.weight_version)
        with self._timer("tokenize"):
            self.tracks.add_generation(result.output_ids, result.logprobs)
            text = self.encoder.processor.tokenizer.decode(result.output_ids, skip_special_tokens=True)
        if result.finish_reason.type == "length":
            raise _Ended(Status.TRUNCATED, f"the reply hit its limit of {limit} tokens")
        return str(text)

    def _token_limit(self) -> int:
        """This turn's `max_new_tokens`: the per-turn cap, clamped to what is left of both budgets."""
        settings, tracks = self.settings, self.tracks
        left_episode = settings.rollout_max_response_len - tracks.num_generated
        left_context = settings.rollout_max_context_len - tracks.context_length
        if left_context < 1:
            raise self._spent("context", settings.rollout_max_context_len)
        if left_episode < 1:
            raise self._spent("generated-token", settings.rollout_max_response_len)
        return min(settings.sampling.max_new_tokens, left_episode, left_context)

    @staticmethod
    def _spent(budget: str, limit: int) -> _Ended:
        """The TRUNCATED ending for a spent budget."""
        return _Ended(Status.TRUNCATED, f"the {budget} budget of {limit} tokens is spent")

    async def _timed_env(self, call: Awaitable[T], part: str | None = None) -> T:
        """Await an env call, counting its time in `env`, and in `part` of it too if named."""
        with self._timer("env", part):
            return await call

    @contextlib.contextmanager
    def _timer(self, name: str, part: str | None = None) -> Iterator[None]:
        """Count the block's seconds in `name`, and the same seconds in `part` if named."""
        started = time.perf_counter()
        try:
            yield
        finally:
            spent = time.perf_counter() - started
            self.timings[name] += spent
            if part is not None:
                self.timings[part] += spent

    def policy_version(self, default: int) -> int:
        """The oldest policy version that generated a turn (`policy_version_of`), else `default` (the
        job's) when no turn's engine reported one."""
        known = [v for v in map(policy_version_of, self.versions) if v is not None]
        return min(known) if known else default

    def labels(self) -> dict[str, str]:
        """The env's own text metrics (a question type, a scene name), by name."""
        env_metrics = self.info.get("metrics")
        if not isinstance(env_metrics, Mapping):
            return {}
        return {str(name): value for name, value in env_metrics.items() if isinstance(value, str)}

    def metrics(self) -> dict[str, float]:
        """Rollout counts, finish reasons, and the env's own numeric metrics as `env/<name>`."""
        tracks = self.tracks
        metrics = {
            "turns": float(tracks.num_turns),
            "generated_tokens": float(tracks.num_generated),
            "context_tokens": float(tracks.context_length),
            "images": float(len(tracks.images)),
            **{f"finish_{reason}": float(self.finishes[reason]) for reason in ("stop", "length", "abort")},
        }
        env_metrics = self.info.get("metrics")
        if isinstance(env_metrics, Mapping):
            for name, value in env_metrics.items():
                if isinstance(value, (bool, int, float)) and math.isfinite(value):
                    metrics[f"env/{name}"] = float(value)
        return metrics


async def _generate(engine: Engine, request: GenerateRequest) -> GenerateResult:
    """`engine.generate`, with any exception turned into an abort result and cancellation passed on
    (after asking the engine to abort the request)."""
    try:
        return await engine.generate(request)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(engine.abort(request.rid), ENGINE_ABORT_TIMEOUT_S)
        raise
    except Exception as exc:
        return GenerateResult.abort(request.rid, f"{type(exc).__name__}: {exc}", engine.weight_version)


async def run_episode(
    env: EpisodeEnv,
    engine: Engine,
    processor: VLProcessor | TurnEncoder,
    job: EpisodeJob,
    *,
    reward_fn: RewardFn = env_reward,
    deadline_s: float | None = None,
) -> Trajectory:
    """Play `job` on `env` (which it resets and always closes) with `engine`; never raises but cancellation.

    `processor` may be a `TurnEncoder` built once and shared across episodes. `deadline_s` bounds the whole
    episode (ABORTED when exceeded).
    """
    encoder = processor if isinstance(processor, TurnEncoder) else TurnEncoder(processor)
    started = time.perf_counter()
    settings = job.settings
    if job.sampling_seed is not None:
        settings = settings.sampled_with(sampling_seed=job.sampling_seed)
    episode = _Episode(env, engine, encoder, settings, job.episode_id)
    status, error = await _play(episode, job, deadline_s)
    reward = 0.0
    if status in (Status.COMPLETED, Status.TRUNCATED) and episode.turn_rewards:
        try:
            tracks = episode.tracks
            generated = [t for t, m in zip(tracks.train_ids, tracks.loss_mask, strict=True) if m]
            reward = float(reward_fn(episode.turn_rewards, {**episode.info, "generated_ids": generated}))
            if not math.isfinite(reward):
                raise ValueError(f"it returned {reward}")
        except Exception as exc:
            status, error = Status.FAILED, f"reward function failed: {type(exc).__name__}: {exc}"
    timings = dict(episode.timings)
    timings["total"] = time.perf_counter() - started
    return Trajectory.from_tracks(
        episode.tracks,
        episode_id=job.episode_id,
        group_id=job.group_id,
        policy_version=episode.policy_version(job.policy_version),
        status=status,
        error=error,
        attempt=job.attempt,
        env=job.env,
        seed=job.seed,
        task_id=job.task_id,
        turn_rewards=episode.turn_rewards,
        episode_reward=reward,
        metrics=episode.metrics(),
        labels=episode.labels(),
        timings=timings,
        behaviour=job.settings.behaviour,
    )


async def _play(episode: _Episode, job: EpisodeJob, deadline_s: float | None) -> tuple[Status, str | None]:
    """Run the episode under its deadline and map every way it can end to (status, error)."""
    deadline = asyncio.timeout(deadline_s)
    try:
        async with deadline:
            return await episode.play(job), None
    except _Ended as ended:
        return ended.status, str(ended)
    except EnvError as exc:
        return Status.FAILED, str(exc)
    except TokenTrackError as exc:
        return Status.FAILED, f"cannot tokenize the env's message: {exc}"
    except TimeoutError:
        if not deadline.expired():
            raise
        return Status.ABORTED, f"the episode deadline of {deadline_s:g} s passed"
    except Exception as exc:
        log.exception("episode %s failed", job.episode_id)
        return Status.FAILED, f"{type(exc).__name__}: {exc}"
    finally:
        await episode.env.close()


def failed_trajectory(job: EpisodeJob, error: str, started: float) -> Trajectory:
    """A FAILED trajectory with no tokens."""
    return Trajectory(
        episode_id=job.episode_id,
        group_id=job.group_id,
        policy_version=job.policy_version,
        status=Status.FAILED,
        error=error,
        attempt=job.attempt,
        env=job.env,
        seed=job.seed,
        task_id=job.task_id,
        timings={"total": time.perf_counter() - started},
        behaviour=job.settings.behaviour,
    )
