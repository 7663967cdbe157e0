"""In-process pieces of the server: wire conversions, several apps sharing one process, what a start
imports."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from typing import Any

import numpy as np
from fastapi.testclient import TestClient
from PIL import Image

from clients.images import decode_image, encode_image
from services.env_api import EnvObservation
from services.server.app import create_app
from services.server.encoding import json_safe, message_to_wire, observation_to_wire
from services.server.settings import ServerSettings
from tests.envs.counter import ENV_FACTORY


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


# In a fresh interpreter, what `vistarl serve sokoban` imports before it answers.
SERVE_IMPORTS = """
import json, sys
import cli.main
from services.env_api import load_env_factory
from services.server.app import create_app
create_app(load_env_factory("sokoban"))
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in ("aiohttp", "pyarrow", "trainer"))))
"""


def test_a_server_start_imports_neither_the_http_clients_nor_pyarrow_nor_the_trainer() -> None:
    """Each would add to every server start (docs/benchmarks.md, "Start-up"): the clients are for agents,
    pyarrow for `--data` splits (imported with the first), the trainer for other commands."""
    done = subprocess.run([sys.executable, "-c", SERVE_IMPORTS], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []
