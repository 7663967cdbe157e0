"""What a test needs from the machine. Elsewhere a missing tool skips the test; in CI (`CI=true`) it fails
it, so that a CI log never passes over a test that did not run."""

from __future__ import annotations

import os

import pytest

IN_CI = os.environ.get("CI", "").lower() == "true"


def require(present: bool, missing: str) -> None:
    """Skip the calling test when `present` is false, saying what is `missing`; in CI, fail it instead."""
    if present:
        return
    if IN_CI:
        pytest.fail(f"CI=true, and {missing}", pytrace=False)
    pytest.skip(missing)
