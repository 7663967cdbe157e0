"""Geo3k behind a real `vistarl serve geo3k` process, through the Python client: envs in server threads and
in env worker processes (where grading starts its own processes)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from vistarl.clients.errors import BadRequestError
from vistarl.clients.http import EnvClient
from vistarl.clients.images import decode_image
from vistarl.devtools.servers import running_process, vistarl_cmd
from vistarl.httpserver.launch import free_port
from vistarl.services.geo3k.generator import generate
from vistarl.services.geo3k.generator.diagram import IMAGE_SIZE


@pytest.fixture(scope="module", params=[0, 1], ids=["threads", "env-workers"])
def client(request: pytest.FixtureRequest) -> Iterator[EnvClient]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = vistarl_cmd(
        "serve", "geo3k", "--port", str(port), "--log-level", "warning", "--env-workers", str(request.param)
    )
    with (
        running_process(command, ready_url=f"{url}/health", env={"VISTARL_API_TOKEN": ""}),
        EnvClient(url, timeout=60.0) as c,
    ):
        yield c


def tool_call(answer: str) -> str:
    return (
        "<tool_call>" + json.dumps({"name": "calc_score", "arguments": {"answer": answer}}) + "</tool_call>"
    )


def test_an_episode_over_http_ends_with_the_final_answer_reward(client: EnvClient) -> None:
    answer = generate(31).answer
    with client.episode(seed=31, format=True) as episode:
        assert episode.info["seed"] == 31
        (image,) = episode.observation.images
        assert decode_image(image).size == (IMAGE_SIZE, IMAGE_SIZE)
        assert episode.message is not None and episode.message.content[0].type == "image_url"
        wrong = episode.step(tool_call(f"{answer} + 1"))
        assert not wrong.done and wrong.info["outcome"] == "wrong" and wrong.observation.images == []
        right = episode.step(tool_call(answer))
        assert not right.done and "calc_score result: 1.0" in right.observation.text
        final = episode.step(f"Answer: \\boxed{{{answer}}}")
    assert final.done and final.reward == final.info["episode_reward"] == 1.0
    assert final.info["tool_scores"] == [0.0, 1.0, None] and final.info["metrics"]["success"] is True


def test_bad_options_are_422_naming_the_field(client: EnvClient) -> None:
    with pytest.raises(BadRequestError) as caught:
        client.reset(options={"max_turns": 0})
    assert caught.value.status == 422 and "max_turns" in caught.value.message


def test_info_publishes_the_options_schema(client: EnvClient) -> None:
    info = client.info()
    assert info.name == "geo3k" and "calc_score" in info.system_prompt
    assert {"max_turns", "grade_timeout_s", "show_choices", "end_on_correct"} <= info.config_schema[
        "properties"
    ].keys()


def test_both_tool_names_are_taken_in_the_tool_call_field_as_in_the_text(client: EnvClient) -> None:
    answer = generate(31).answer
    session = client.reset(seed=31).session_id
    for name in ("calc_geo3k_reward", "calc_score"):
        body = {"session_id": session, "tool_call": {"name": name, "arguments": {"answer": answer}}}
        step = httpx.post(f"{client.base_url}/step", json=body, timeout=60)
        assert step.status_code == 200, step.text
        assert step.json()["info"]["outcome"] == "correct"
        assert step.json()["info"]["tool_call"]["name"] == name
    client.close(session)


@pytest.mark.parametrize(
    ("image", "mention"),
    [
        ("data:image/png;base64,!!!", "invalid base64"),
        ("https://example.com/diagram.png", "image URLs are not fetched; send the image as a data URL"),
    ],
)
def test_a_bad_image_in_a_sample_is_invalid_image_with_a_plain_message(
    client: EnvClient, image: str, mention: str
) -> None:
    sample = {"problem": "<image>Find x.", "answer": "3", "images": [image]}
    with pytest.raises(BadRequestError) as caught:
        client.reset(sample=sample)
    assert (caught.value.status, caught.value.code) == (422, "invalid_image")
    assert caught.value.message.startswith(f"sample.images.0: {mention}")
