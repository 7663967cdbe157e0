"""Trajectories for the learner's tests, built with the rollout's own token tracks.

A conversation (prompt, then assistant replies and user observations in turn) becomes a `Trajectory`
through `TokenTracks.from_conversation`, as SFT data does, so its ids, loss mask and turn index are the
ones a rollout of those replies would record, played with a default config's sampling unless told
otherwise. `scored_by` fills in the rollout logprobs an engine serving the given weights would have
reported, at the trajectory's own temperature.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from tests.runners import SETTINGS
from tests.vl_samples import noise_image
from vistarl.clients.images import encode_image
from vistarl.trainer.learner.logprobs import sequence_logprobs
from vistarl.trainer.rollout.processor import VLProcessor
from vistarl.trainer.rollout.tokenization import TokenTracks, TurnEncoder
from vistarl.trainer.rollout.trajectory import Behaviour, Status, Trajectory


def conversation(
    prompt: str,
    replies: Sequence[str],
    observation: str = "Go on.",
    image_size: tuple[int, int] | None = None,
) -> list[dict[str, Any]]:
    """A user prompt (with one random image of `image_size`, if given), then each reply, with
    `observation` between two replies."""
    content: list[dict[str, Any]] = [{"type": "text", "text": prompt}]
    if image_size is not None:
        image = noise_image(np.random.default_rng(sum(image_size)), *image_size)
        content.insert(0, {"type": "image_url", "image_url": {"url": encode_image(image)}})
    messages: list[dict[str, Any]] = [{"role": "user", "content": content}]
    for turn, reply in enumerate(replies):
        if turn:
            messages.append({"role": "user", "content": observation})
        messages.append({"role": "assistant", "content": reply})
    return messages


def trajectory(
    encoder: TurnEncoder,
    messages: Sequence[dict[str, Any]],
    episode_id: str,
    group_id: str,
    reward: float = 0.0,
    turn_rewards: Sequence[float] = (),
    status: Status = Status.COMPLETED,
    behaviour: Behaviour = SETTINGS.behaviour,
) -> Trajectory:
    """The trajectory of a conversation played with `behaviour`, with its outcome."""
    return Trajectory.from_tracks(
        TokenTracks.from_conversation(encoder, messages),
        episode_id=episode_id,
        group_id=group_id,
        policy_version=0,
        status=status,
        episode_reward=reward,
        turn_rewards=list(turn_rewards),
        behaviour=behaviour,
    )


def token_logprobs_of(model: nn.Module, processor: VLProcessor, trajectory: Trajectory) -> torch.Tensor:
    """`[L]` logprobs `model` gives the trajectory's generated tokens at its behaviour's temperature (1
    without one), 0 elsewhere."""
    temperature = trajectory.behaviour.temperature if trajectory.behaviour is not None else 1.0
    with torch.no_grad():
        return sequence_logprobs(
            model, processor, trajectory.train_ids, trajectory.images, temperature, mask=trajectory.loss_mask
        )


def generated_logprob(model: nn.Module, processor: VLProcessor, trajectory: Trajectory) -> float:
    """The logprob `model` gives the whole of the trajectory's generated tokens."""
    return float(token_logprobs_of(model, processor, trajectory).sum())


def scored_by(
    model: nn.Module, processor: VLProcessor, trajectories: Sequence[Trajectory]
) -> list[Trajectory]:
    """The trajectories with the logprobs `model` gives their generated tokens as rollout logprobs, as an
    engine serving its weights would have reported them."""
    return [
        Trajectory.from_dict(
            {**t.to_dict(), "rollout_logprobs": token_logprobs_of(model, processor, t).tolist()}
        )
        for t in trajectories
    ]
