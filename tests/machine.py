"""What a test needs from the machine. Elsewhere a missing tool skips the test; in CI (`CI=true`) it fails
it, so that a CI log never passes over a test that did not run. A test that waits longer than
pytest-timeout's limit (300 s, pyproject.toml) takes a limit of its own, past its waits (`outlasting`)."""

from __future__ import annotations

import os

import pytest

IN_CI = os.environ.get("CI", "").lower() == "true"
SETUP_S = 120.0
"""What `outlasting` adds to a test's waits: its fixtures' start and its own work between the waits."""


def require(present: bool, missing: str) -> None:
    """Skip the calling test when `present` is false, saying what is `missing`; in CI, fail it instead."""
    if present:
        return
    if IN_CI:
        pytest.fail(f"CI=true, and {missing}", pytrace=False)
    pytest.skip(missing)


def outlasting(*waits_s: float) -> pytest.MarkDecorator:
    """A test's time limit past its own bounded waits, taken one after another (plus `SETUP_S`), so that
    each wait can fail with its own message before pytest-timeout ends the test."""
    return pytest.mark.timeout(sum(waits_s) + SETUP_S)
