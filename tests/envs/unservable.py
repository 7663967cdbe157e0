"""The counter env, which refuses to load in a `vistarl serve` process: an env server that dies at every
start, for the supervisor's tests. Any other process (a trainer checking its config) loads it at once."""

from __future__ import annotations

import sys

from tests.envs.counter import ENV_FACTORY

__all__ = ["ENV_FACTORY"]

if sys.argv[1:2] == ["serve"]:
    raise RuntimeError("tests.envs.unservable refuses to be served")
