"""The trajectory record a rollout worker publishes and the trainer consumes.

A `Trajectory` holds one episode: identity and bookkeeping, the two token tracks with their aligned
per-token data, the images in pad order, the conversation, the outcome, and its `Behaviour`: the sampling
settings and staleness it was played with, which the learner reads instead of its own config. It travels
through the queue as msgpack of `to_dict()` (JSON-safe data; no pickle) and is validated whenever it is
built or loaded, so a malformed record fails at the boundary with a message naming the field.
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Annotated, Any

import msgpack
from pydantic import ConfigDict, Field, TypeAdapter, model_validator
from pydantic.dataclasses import dataclass

if TYPE_CHECKING:
    from vistarl.trainer.rollout.tokenization import TokenTracks

__all__ = ["Behaviour", "Status", "Trajectory"]

Bit = Annotated[int, Field(ge=0, le=1)]
GridTHW = tuple[Annotated[int, Field(ge=1)], Annotated[int, Field(ge=1)], Annotated[int, Field(ge=1)]]


class Status(str, Enum):
    """How an episode ended: finish reason `length` gives TRUNCATED, `abort` ABORTED; errors give FAILED."""

    COMPLETED = "COMPLETED"
    TRUNCATED = "TRUNCATED"
    ABORTED = "ABORTED"
    FAILED = "FAILED"

    @property
    def played(self) -> bool:
        """Whether the episode reached an ending the env scored (COMPLETED or TRUNCATED)."""
        return self in (Status.COMPLETED, Status.TRUNCATED)


@dataclass(config=ConfigDict(extra="forbid", allow_inf_nan=False), frozen=True, kw_only=True)
class Behaviour:
    """The policy an episode was played with, as the learner needs it: the sampler's temperature (its
    logprobs are `log_softmax(logits / temperature)`, docs/engines.md; 0 is greedy) and filters, and how
    many policy versions behind the trainer's the episode may be when it is trained on."""

    temperature: float = Field(ge=0)
    top_p: float = Field(gt=0, le=1)
    top_k: int = Field(ge=-1)
    min_p: float = Field(ge=0, le=1)
    max_staleness: int = Field(ge=0)


@dataclass(config=ConfigDict(extra="forbid", allow_inf_nan=False), kw_only=True)
class Trajectory:
    """One episode, token-exact. `loss_mask`, `rollout_logprobs` and `turn_index` align with `train_ids`."""

    episode_id: str = Field(min_length=1)
    group_id: str = Field(min_length=1)
    policy_version: int = Field(ge=0)
    status: Status
    error: str | None = None
    attempt: int = Field(default=1, ge=1)
    env: str = ""
    seed: int | None = Field(default=None, description="the seed the env was reset with (None: not a seed)")
    task_id: str | None = Field(default=None, description="the task the env was reset with (SPLIT/INDEX)")
    engine_ids: list[int] = Field(default_factory=list)
    train_ids: list[int] = Field(default_factory=list)
    loss_mask: list[Bit] = Field(default_factory=list)
    rollout_logprobs: list[float] = Field(default_factory=list)
    turn_index: list[Annotated[int, Field(ge=0)]] = Field(default_factory=list)
    images: list[str] = Field(default_factory=list)
    image_grid_thw: list[GridTHW] = Field(default_factory=list)
    messages: list[dict[str, Any]] = Field(default_factory=list)
    turn_rewards: list[float] = Field(default_factory=list)
    episode_reward: float = 0.0
    metrics: dict[str, float] = Field(default_factory=dict)
    labels: dict[str, str] = Field(
        default_factory=dict, description="the env's text metrics (a question type)"
    )
    timings: dict[str, float] = Field(default_factory=dict)
    behaviour: Behaviour | None = Field(
        default=None, description="how it was played; None for a demonstration, which nothing sampled"
    )

    @model_validator(mode="after")
    def _check_alignment(self) -> Trajectory:
        """Aligned tracks must have equal lengths, and every image needs its grid."""
        aligned = {
            "train_ids": len(self.train_ids),
            "loss_mask": len(self.loss_mask),
            "rollout_logprobs": len(self.rollout_logprobs),
            "turn_index": len(self.turn_index),
        }
        if len(set(aligned.values())) > 1:
            raise ValueError(f"tracks aligned with train_ids differ in length: {aligned}")
        if len(self.images) != len(self.image_grid_thw):
            raise ValueError(f"{len(self.images)} images but {len(self.image_grid_thw)} image_grid_thw rows")
        return self

    @property
    def trainable(self) -> bool:
        """Whether the update can learn from it: played to a scored ending, with a generated token."""
        return self.status.played and any(self.loss_mask)

    @classmethod
    def from_tracks(cls, tracks: TokenTracks, **fields: Any) -> Trajectory:
        """A trajectory with the tracks' tokens, images and messages; `fields` give identity and outcome."""
        return cls(
            engine_ids=list(tracks.engine_ids),
            train_ids=list(tracks.train_ids),
            loss_mask=list(tracks.loss_mask),
            rollout_logprobs=list(tracks.rollout_logprobs),
            turn_index=list(tracks.turn_index),
            images=list(tracks.images),
            image_grid_thw=list(tracks.image_grid_thw),
            messages=list(tracks.messages),
            **fields,
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe data (lists, strings, finite numbers); the field names are the contract."""
        data: dict[str, Any] = _ADAPTER.dump_python(self, mode="json")
        return data

    @classmethod
    def from_dict(cls, data: Any) -> Trajectory:
        """Validate and load what `to_dict` produced; raises `pydantic.ValidationError` (a ValueError)."""
        return _ADAPTER.validate_python(data)

    def to_msgpack(self) -> bytes:
        """The queue's wire form: msgpack of `to_dict()`."""
        return bytes(msgpack.packb(self.to_dict(), use_bin_type=True))

    @classmethod
    def from_msgpack(cls, payload: bytes) -> Trajectory:
        """Decode and validate what `to_msgpack` produced."""
        try:
            data = msgpack.unpackb(payload, raw=False)
        except (ValueError, msgpack.UnpackException) as exc:
            raise ValueError(f"not a msgpack trajectory ({type(exc).__name__}: {exc})") from exc
        return cls.from_dict(data)


_ADAPTER = TypeAdapter(Trajectory)
