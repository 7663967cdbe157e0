"""Load user-supplied callables (reward functions, runner factories) by import path."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def load_callable(module_name: str, attr: str, what: str) -> Callable[..., Any]:
    """Import `module_name` and return its callable `attr`; a ValueError naming `what` otherwise."""
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise ValueError(f"cannot import {what} module {module_name!r}: {exc}") from exc
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"{what} module {module_name!r} has no function {attr!r} (no callable by that name)")
    return fn
