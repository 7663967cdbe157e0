"""VSI behind a real `vistarl serve vsi` process: the same episode over HTTP as in process."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from vistarl.clients.errors import BadRequestError
from vistarl.clients.http import EnvClient
from vistarl.clients.images import decode_image
from vistarl.devtools.servers import env_server
from vistarl.services.vsi import build_env

OPTIONS = {"scene_set": "test", "image_size": 96, "max_turns": 5}
ACTIONS = [
    "<action>rotate_left</action>",
    "<action>move_forward</action>",
    "hmm",
    "<action>look_down</action>",
]


@pytest.fixture(scope="module")
def client() -> Iterator[EnvClient]:
    with env_server("vsi") as url, EnvClient(url, timeout=60.0) as c:
        yield c


def pixels(images: list) -> list[np.ndarray]:
    return [np.asarray(image.convert("RGB")) for image in images]


def test_an_episode_over_http_matches_the_one_in_process(client: EnvClient) -> None:
    local = build_env(seed=21, **OPTIONS)
    local_obs, local_info = local.reset()
    with client.episode(seed=21, options=OPTIONS) as remote:
        assert remote.info == local_info
        assert remote.observation.text == local_obs["text"]
        remote_images = [decode_image(url) for url in remote.observation.images]
        assert all(
            np.array_equal(a, b)
            for a, b in zip(pixels(remote_images), pixels(local_obs["images"]), strict=True)
        )
        answer = f"<answer>{local.question.ground_truth}</answer>"
        for action in [*ACTIONS[:3], answer]:
            expected = local.step(action)
            obs, info = expected.observation, expected.info
            result = remote.step(action)
            assert (result.observation.text, result.done, result.truncated, result.reward) == (
                obs["text"],
                expected.done,
                expected.truncated,
                expected.reward,
            )
            assert result.info["metrics"] == info["metrics"] and result.info["pose"] == info["pose"]
            remote_view = decode_image(result.observation.images[0])
            assert np.array_equal(pixels([remote_view])[0], pixels(obs["images"])[0])
        assert result.terminated and not result.truncated and result.info["episode_reward"] == 1.0


def test_out_of_turns_over_http(client: EnvClient) -> None:
    with client.episode(seed=3, options={**OPTIONS, "max_turns": 2}) as remote:
        remote.step(ACTIONS[0])
        result = remote.step(ACTIONS[3])
        assert result.done and result.truncated and not result.terminated
        assert result.info["metrics"]["truncated"] and result.info["episode_reward"] == 0.0


def test_bad_options_are_422_naming_the_field(client: EnvClient) -> None:
    for options, field in (({"scene_name": "nowhere"}, "scene_name"), ({"image_size": 5000}, "image_size")):
        with pytest.raises(BadRequestError) as caught:
            client.reset(options=options)
        assert caught.value.status == 422 and field in caught.value.message
    info = client.info()
    assert (
        info.name == "vsi"
        and {"scene_name", "question_type", "max_turns"} <= info.config_schema["properties"].keys()
    )
