"""Shared fixtures: a private Redis server per test session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.servers import redis_server


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A real Redis: a private redis-server on a free port, or $REDIS_URL when there is no binary."""
    with redis_server() as url:
        yield url
