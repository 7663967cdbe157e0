"""In-process pieces of the server: wire conversions, several apps sharing one process, what a start
imports."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi import APIRouter, Depends, FastAPI, Response, Security
from fastapi.security import HTTPBearer
from fastapi.testclient import TestClient
from PIL import Image

from tests.envs.counter import ENV_FACTORY
from vistarl.clients.images import decode_image, encode_image
from vistarl.clients.protocol import FormatRequest
from vistarl.devtools.servers import vistarl_cmd, wait_http
from vistarl.httpserver.launch import free_port, stop_process
from vistarl.services.env_api import EnvObservation, user_message
from vistarl.services.server import encoding
from vistarl.services.server.app import create_app
from vistarl.services.server.encoding import json_safe, message_to_wire, observation_to_wire
from vistarl.services.server.json_route import JSONRoute, LeanRoutes
from vistarl.services.server.settings import ServerSettings


def test_json_safe_turns_env_info_into_plain_json() -> None:
    info = {
        "reward": np.float32(0.5),
        "grid": np.arange(4).reshape(2, 2),
        "pos": (1, 2),
        "bad": math.nan,
        "nested": {"inf": math.inf, "ok": np.int64(3)},
    }
    assert json_safe(info) == {
        "reward": 0.5,
        "grid": [[0, 1], [2, 3]],
        "pos": [1, 2],
        "bad": None,
        "nested": {"inf": None, "ok": 3},
    }


def test_observations_and_messages_carry_images_as_data_urls() -> None:
    image = Image.new("RGB", (4, 3), (9, 8, 7))
    url = encode_image(image)
    obs = observation_to_wire(EnvObservation(text="t", images=[image]))
    assert decode_image(obs.images[0], max_bytes=1 << 16, max_pixels=1 << 16).getpixel((0, 0)) == (9, 8, 7)
    message = message_to_wire(
        {
            "role": "user",
            "content": [
                {"type": "image", "image": image},
                {"type": "image_url", "image_url": {"url": url}},
                {"type": "text", "text": "hi"},
            ],
        }
    )
    parts = message.model_dump()["content"]
    assert parts[0]["type"] == parts[1]["type"] == "image_url"
    assert parts[0]["image_url"]["url"].startswith("data:image/png;base64,")
    assert parts[1]["image_url"]["url"] == url
    assert parts[2] == {"type": "text", "text": "hi"}


def test_an_answer_encodes_each_image_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The observation and the message that shows its images share their data URLs, each PNG made once."""
    images = [Image.new("RGB", (4, 3), (9, 8, 7)), Image.new("RGB", (4, 3), (1, 2, 3))]
    made: list[Image.Image] = []
    monkeypatch.setattr(encoding, "encode_image", lambda image: made.append(image) or encode_image(image))
    obs = EnvObservation(text="t", images=images)
    observation, message = encoding.answer_to_wire(obs, user_message(obs))
    assert made == images
    assert message is not None and observation.images == [encode_image(image) for image in images]
    parts = message.model_dump()["content"]
    assert [part["image_url"]["url"] for part in parts[:2]] == observation.images
    assert encoding.answer_to_wire(obs, None)[1] is None


def test_two_apps_in_one_process_keep_their_own_sessions_and_metrics() -> None:
    settings = ServerSettings(api_token=None)
    first, second = create_app(ENV_FACTORY, settings), create_app(ENV_FACTORY, settings)
    with TestClient(first) as a, TestClient(second) as b:
        session = a.post("/reset", json={}).json()["session_id"]
        assert b.post("/step", json={"session_id": session, "action": "inc"}).status_code == 404
        assert "vistarl_env_resets_total 1.0" in a.get("/metrics").text
        assert "vistarl_env_resets_total 0.0" in b.get("/metrics").text


def test_the_hot_endpoints_keep_their_openapi_schema() -> None:
    paths = create_app(ENV_FACTORY, ServerSettings(api_token=None)).openapi()["paths"]

    def schema_ref(content: dict[str, Any]) -> str:
        return str(content["application/json"]["schema"]["$ref"])

    for name in ("Reset", "Step"):
        post = paths[f"/{name.lower()}"]["post"]
        assert schema_ref(post["requestBody"]["content"]).endswith(f"/{name}Request")
        assert schema_ref(post["responses"]["200"]["content"]).endswith(f"/{name}Response")


def refuses_everyone() -> None:
    """A dependency that FastAPI would run, and that the lean path would skip."""
    raise AssertionError("never called")


async def answer(request: FormatRequest) -> bytes:
    return b"{}"


def test_a_lean_route_with_a_dependency_it_would_skip_fails_when_built() -> None:
    router = APIRouter()
    declared = Security(HTTPBearer(auto_error=False))  # never refuses: the guard checks the token
    router.add_api_route(
        "/ok", answer, methods=["POST"], route_class_override=JSONRoute, dependencies=[declared]
    )
    for dependency, name in (
        (Depends(refuses_everyone), "refuses_everyone"),
        (Security(HTTPBearer()), "HTTPBearer"),
    ):
        with pytest.raises(TypeError, match=rf"/format is served on the lean path.*declares {name}"):
            router.add_api_route(
                "/format", answer, methods=["POST"], route_class_override=JSONRoute, dependencies=[dependency]
            )


def test_lean_routes_refuse_at_start_a_session_delete_with_a_dependency() -> None:
    async def delete_session(session_id: str) -> Response:
        return Response(status_code=204)

    app = FastAPI()
    app.add_api_route(
        "/sessions/{session_id}", delete_session, methods=["DELETE"], dependencies=[Depends(refuses_everyone)]
    )
    app.add_middleware(LeanRoutes, routes=app.routes, handlers=app.exception_handlers)
    with (
        pytest.raises(
            TypeError, match=r"/sessions/\{session_id\} is served on the lean path.*refuses_everyone"
        ),
        TestClient(app),
    ):
        pass


# What a start of `vistarl serve sokoban` leaves for later, each with who imports it instead.
NOT_AT_START = (
    "aiohttp",  # the HTTP clients: agents'
    "pyarrow",  # a `--data` split, with the first one opened
    "trainer",  # other commands'
    "vistarl.services.sokoban.env",  # the env itself (its renderer and numpy): the env worker processes
    "numpy",
    "jsonschema",  # a tool call's arguments, checked from the first /step with one
    "mcp",  # the MCP SDK: the first /mcp request
    "rich",  # other commands' tables and progress bars
    "websockets",  # the WebSocket protocol of /ws: the first upgrade (vistarl/cli/serve.py)
    "vistarl.cli.data",  # the other command groups
    "vistarl.cli.train",
)


def test_a_server_start_leaves_what_it_does_not_serve_with_for_later(tmp_path: Path) -> None:
    """Each would add to every server start (docs/benchmarks.md, "Start-up"). The server process is run
    with `-X importtime` until it answers /health; its env worker processes, which do load the env, are
    not (they do not inherit the flag)."""
    port = free_port()
    command = [sys.executable, "-X", "importtime", *vistarl_cmd("serve", "sokoban", "--port", str(port))[1:]]
    log = tmp_path / "imports.log"
    with log.open("wb") as stderr:
        server = subprocess.Popen(
            command, stderr=stderr, env={**os.environ, "VISTARL_API_TOKEN": ""}, start_new_session=True
        )
        try:
            wait_http(f"http://127.0.0.1:{port}/health", proc=server)
        finally:
            stop_process(server)
    lines = [line for line in log.read_text().splitlines() if line.startswith("import time:")]
    imported = {line.rsplit("|", 1)[1].strip() for line in lines}
    assert "fastapi" in imported
    early = sorted(m for m in imported if any(m == lazy or m.startswith(f"{lazy}.") for lazy in NOT_AT_START))
    assert early == []
