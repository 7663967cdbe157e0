"""Shared fixtures: a private Redis server per test session, tiny checkpoints, both env clients."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from clients import EnvClient
from tests.client_kinds import BlockingAsyncClient, Client
from tests.servers import redis_server


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A real Redis: a private redis-server on a free port, or $REDIS_URL when there is no binary."""
    with redis_server() as url:
        yield url


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny random-init Qwen2.5-VL and Qwen3-VL checkpoint directories, written once per session."""
    from devtools.tiny_checkpoint import ARCHS, write_tiny_checkpoint

    root = tmp_path_factory.mktemp("tiny-checkpoints")
    return {arch: write_tiny_checkpoint(root / arch, arch, seed=0) for arch in ARCHS}


@pytest.fixture(scope="session")
def tiny_qwen25(tiny_checkpoints: dict[str, Path]) -> Path:
    """The tiny Qwen2.5-VL checkpoint directory."""
    return tiny_checkpoints["qwen2_5_vl"]


@pytest.fixture(scope="session")
def tiny_qwen3(tiny_checkpoints: dict[str, Path]) -> Path:
    """The tiny Qwen3-VL checkpoint directory."""
    return tiny_checkpoints["qwen3_vl"]


@pytest.fixture(params=[EnvClient, BlockingAsyncClient], ids=["sync", "async"])
def client_type(request: pytest.FixtureRequest) -> type[Client]:
    """Each test that takes it runs with `EnvClient` and with `AsyncEnvClient` (`tests.client_kinds`)."""
    return request.param  # type: ignore[no-any-return]
