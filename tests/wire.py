"""Checks for tests that speak the env wire protocol with httpx: one reset, one step, one error answer."""

from __future__ import annotations

from typing import Any

import httpx

from vistarl.clients.protocol import ErrorResponse, ResetResponse, StepResponse


def reset(http: httpx.Client, **body: Any) -> ResetResponse:
    """POST /reset with `body`, which must succeed."""
    response = http.post("/reset", json=body)
    assert response.status_code == 200, response.text
    return ResetResponse.model_validate(response.json())


def step(http: httpx.Client, session_id: str, action: str = "inc", **body: Any) -> StepResponse:
    """POST /step of `action`, which must succeed."""
    response = http.post("/step", json={"session_id": session_id, "action": action, **body})
    assert response.status_code == 200, response.text
    return StepResponse.model_validate(response.json())


def assert_error(response: httpx.Response, status: int, code: str, *mentions: str) -> ErrorResponse:
    """The response is an `ErrorResponse` with this status and code whose message names `mentions`."""
    assert response.status_code == status, response.text
    error = ErrorResponse.model_validate(response.json())
    assert error.error.code == code
    for word in mentions:
        assert word in error.error.message
    return error
