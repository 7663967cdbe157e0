"""The trajectory record: built from token tracks, validated on load, round-tripped via msgpack and JSON."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from tests.runners import SETTINGS
from vistarl.clients.images import encode_image
from vistarl.trainer.queue.worker import pack_result
from vistarl.trainer.rollout.job import EpisodeJob
from vistarl.trainer.rollout.processor import VLProcessor
from vistarl.trainer.rollout.tokenization import TokenTracks, TurnEncoder
from vistarl.trainer.rollout.trajectory import Status, Trajectory


def small_trajectory(**overrides: Any) -> Trajectory:
    """A hand-built two-turn record (ids need not be real tokens here)."""
    fields: dict[str, Any] = dict(
        episode_id="ep-1",
        group_id="g-1",
        policy_version=4,
        status=Status.TRUNCATED,
        env="sokoban",
        engine_ids=[1, 2, 3, 4, 5, 6],
        train_ids=[1, 2, 2, 2, 3, 4, 5, 6],
        loss_mask=[0, 0, 0, 0, 0, 1, 0, 1],
        rollout_logprobs=[0.0, 0.0, 0.0, 0.0, 0.0, -0.25, 0.0, -1.5],
        turn_index=[0, 0, 0, 0, 0, 0, 1, 1],
        images=["data:image/png;base64,AAAA"],
        image_grid_thw=[(1, 2, 6)],
        messages=[{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]}],
        turn_rewards=[0.1, -0.1],
        episode_reward=0.5,
        metrics={"success": 0.0, "steps": 2},
        timings={"generate_s": 0.25},
    )
    return Trajectory(**(fields | overrides))


def test_msgpack_round_trip() -> None:
    trajectory = small_trajectory()
    payload = trajectory.to_msgpack()
    assert Trajectory.from_msgpack(payload) == trajectory
    assert msgpack.unpackb(payload)["status"] == "TRUNCATED"


def test_json_round_trip() -> None:
    trajectory = small_trajectory(error="env timed out")
    text = json.dumps(trajectory.to_dict(), allow_nan=False)
    data = json.loads(text)
    assert data["image_grid_thw"] == [[1, 2, 6]]
    assert data["status"] == "TRUNCATED"
    assert Trajectory.from_dict(data) == trajectory


@settings(max_examples=30, deadline=None)
@given(logprobs=st.lists(st.floats(max_value=0.0, allow_nan=False, allow_infinity=False), max_size=20))
def test_logprobs_survive_both_wire_forms_exactly(logprobs: list[float]) -> None:
    n = len(logprobs)
    trajectory = small_trajectory(
        engine_ids=list(range(n)),
        train_ids=list(range(n)),
        loss_mask=[1] * n,
        rollout_logprobs=logprobs,
        turn_index=[0] * n,
    )
    assert Trajectory.from_msgpack(trajectory.to_msgpack()).rollout_logprobs == logprobs
    assert Trajectory.from_dict(json.loads(json.dumps(trajectory.to_dict()))).rollout_logprobs == logprobs


def test_a_failed_episode_needs_no_tokens() -> None:
    failed = Trajectory(episode_id="ep-2", group_id="g", policy_version=0, status=Status.FAILED, error="boom")
    loaded = Trajectory.from_msgpack(failed.to_msgpack())
    assert loaded == failed and loaded.status is Status.FAILED
    assert failed.to_dict()["train_ids"] == [] and failed.attempt == 1


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"loss_mask": [0, 0, 0, 0, 0, 1, 0]}, "tracks aligned with train_ids differ in length"),
        ({"turn_index": [0]}, "'turn_index': 1"),
        ({"image_grid_thw": []}, "1 images but 0 image_grid_thw rows"),
        ({"image_grid_thw": [(1, 2)]}, "image_grid_thw.0"),
        ({"loss_mask": [0, 0, 0, 0, 0, 2, 0, 1]}, "loss_mask.5"),
        ({"rollout_logprobs": [0.0] * 7 + [-math.inf]}, "finite number"),
        ({"status": "DONE"}, "status"),
        ({"episode_id": ""}, "episode_id"),
        ({"policy_version": -1}, "policy_version"),
        ({"reward": 1.0}, "reward"),
    ],
)
def test_malformed_records_are_refused(overrides: dict[str, Any], expected: str) -> None:
    data = small_trajectory().to_dict() | overrides
    with pytest.raises(ValueError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        Trajectory.from_dict(data)


def test_garbage_payloads_are_refused() -> None:
    with pytest.raises(ValueError, match="not a msgpack trajectory"):
        Trajectory.from_msgpack(b"\xc1\x00")
    with pytest.raises(ValueError, match="dictionary"):
        Trajectory.from_msgpack(msgpack.packb([1, 2, 3]))


def test_from_tracks_and_through_the_queue(tiny_qwen25: Path) -> None:
    encoder = TurnEncoder(VLProcessor.from_pretrained(tiny_qwen25))
    image = encode_image(Image.new("RGB", (64, 64), (200, 30, 30)))
    tracks = TokenTracks(encoder)
    parts = [{"type": "image_url", "image_url": {"url": image}}, {"type": "text", "text": "go"}]
    tracks.add_prompt([{"role": "user", "content": parts}])
    reply = [*encoder.encode("<answer>Left</answer>"), encoder.ids.im_end]
    tracks.add_generation(reply, [-0.5] * len(reply))
    trajectory = Trajectory.from_tracks(
        tracks, episode_id="ep-3", group_id="g", policy_version=1, status=Status.COMPLETED, turn_rewards=[1.0]
    )
    assert trajectory.train_ids == list(tracks.train_ids)
    assert trajectory.images == [image] and trajectory.image_grid_thw == [(1, 4, 4)]
    assert sum(trajectory.loss_mask) == len(reply)
    # The worker stamps the attempt and ships msgpack; the trainer side validates it back.
    job = EpisodeJob(episode_id="ep-3", group_id="g", env="sokoban", attempt=2, settings=SETTINGS)
    received = Trajectory.from_msgpack(pack_result(job, trajectory))
    assert received.attempt == 2
    assert received.train_ids == trajectory.train_ids
    assert received.messages[0]["content"][0] == {"type": "image"}
