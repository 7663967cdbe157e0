"""docs/envs.md works as printed: its minimal env, written out as the package it says, is served with an
env worker process, played from the page's own client code, refuses a bad option, and continues from its
state; its tiny config loads (and its bad option fails as the page says); its registry block is the
registry plus the one new line."""

from __future__ import annotations

import contextlib
import io
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from vistarl.devtools.servers import running_process, vistarl_cmd
from vistarl.httpserver.launch import free_port
from vistarl.services.env_api import ENV_MODULES, checked_step, load_env_factory
from vistarl.trainer.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[1]
PAGE = (ROOT / "docs" / "envs.md").read_text(encoding="utf-8")


def block(language: str, starting: str) -> str:
    """The page's fenced `language` block whose text starts with `starting`."""
    for found in re.finditer(rf"```{language}\n(.*?)```", PAGE, re.DOTALL):
        if found.group(1).startswith(starting):
            return found.group(1)
    raise AssertionError(f"docs/envs.md has no {language} block starting {starting!r}")


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder that holds the page's `corridor/__init__.py`."""
    root = tmp_path_factory.mktemp("envs-doc")
    (root / "corridor").mkdir()
    (root / "corridor" / "__init__.py").write_text(block("python", '"""A corridor'), encoding="utf-8")
    return root


@pytest.fixture
def importable(package: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """`corridor` importable in this process, as `PYTHONPATH=.` makes it for the commands."""
    monkeypatch.syspath_prepend(str(package))
    yield
    sys.modules.pop("corridor", None)


def test_the_minimal_env_is_served_and_played_as_the_page_says(package: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = vistarl_cmd("serve", "corridor", "--port", str(port), "--env-workers", "1")
    python_path = {"PYTHONPATH": f"{package}:{ROOT}", "VISTARL_API_TOKEN": ""}
    with running_process(command, ready_url=f"{url}/health", env=python_path, cwd=ROOT):
        assert httpx.get(f"{url}/ready", timeout=30).json()["ready"] is True  # the env worker loaded it
        printed = io.StringIO()
        client_code = block("python", "from vistarl.clients import EnvClient").replace(
            "http://127.0.0.1:8000", url
        )
        with contextlib.redirect_stdout(printed):
            exec(compile(client_code, "docs/envs.md", "exec"), {})  # the page's own example, as printed
        assert printed.getvalue().split() == ["2", "1.0"]
        refused = httpx.post(f"{url}/reset", json={"options": {"lenght": 3}}, timeout=30)
        assert refused.status_code == 422 and "lenght" in refused.json()["error"]["message"]
        assert httpx.get(f"{url}/play", timeout=30).status_code == 200


@pytest.mark.usefixtures("importable")
def test_the_minimal_env_continues_from_its_state() -> None:
    factory = load_env_factory("corridor")
    env = factory.create(factory.options_model.model_validate({"length": 3}), 7, None)
    env.reset()
    checked_step(env, "right")
    twin = factory.restore(env.state())
    assert twin.state() == env.state() == {"options": {"length": 3}, "seed": 7, "position": 1, "turns": 1}
    assert checked_step(twin, "right") == checked_step(env, "right")
    assert (
        factory.create(factory.options_model(), None, None).format_observation(env.reset()[0])["role"]
        == "user"
    )


@pytest.mark.usefixtures("importable")
def test_the_tiny_config_loads_and_its_bad_option_fails_as_the_page_says(tmp_path: Path) -> None:
    config = tmp_path / "corridor.yaml"
    config.write_text(block("yaml", "model:"), encoding="utf-8")
    assert load_config(config, []).env.options == {"length": 2, "max_turns": 4}
    with pytest.raises(
        ConfigError, match=re.escape("env.options.lenght: unknown key (did you mean 'length'?)")
    ):
        load_config(config, ["env.options.lenght=3"])
    assert "env.options.lenght: unknown key (did you mean 'length'?)" in PAGE


def test_the_registry_block_is_the_registry_and_one_line() -> None:
    lines = re.findall(r'"(\w+)": "([\w.]+)"', block("python", "ENV_MODULES"))
    assert dict(lines) == {**ENV_MODULES, "corridor": "services.corridor"}
