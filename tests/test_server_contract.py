"""The HTTP contract as another language sees it: every answer of a live server, errors included, is valid
against the server's own `/openapi.json` (checked by openapi-core); CORS for browsers; the bearer scheme
in any case (RFC 7235); `/ready`'s 503 body.

One `vistarl serve tests.envs.counter` process with a token, two session slots and one CORS origin.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
import requests
from openapi_core import OpenAPI
from openapi_core.contrib.requests import RequestsOpenAPIRequest, RequestsOpenAPIResponse

from tests.envs.serving import counter_server

TOKEN = "contract-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ORIGIN = "https://play.example"
MAX_BODY = 64 * 1024
TIMEOUT = 30.0


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    flags = ("--max-sessions", "2", "--max-body-bytes", str(MAX_BODY), "--cors-origin", ORIGIN)
    with counter_server(*flags, env={"VISTARL_API_TOKEN": TOKEN, "VISTARL_RETRY_AFTER_S": "2"}) as base:
        yield base


@pytest.fixture
def http() -> Iterator[requests.Session]:
    with requests.Session() as session:
        session.headers.update(AUTH)
        yield session


def exchange(http: requests.Session, url: str) -> Iterator[requests.Response]:
    """One of each answer the server gives: every route, every error status it can send."""
    yield http.get(f"{url}/health", headers={"Authorization": ""})
    yield http.get(f"{url}/info")
    yield http.get(f"{url}/info", headers={"Authorization": "Bearer wrong"})  # 401
    yield http.get(f"{url}/metrics")
    yield http.get(f"{url}/ready")
    yield http.post(f"{url}/reset", data=b'{"seed": ', headers={"content-type": "application/json"})  # 400
    yield http.post(f"{url}/reset", json={"options": {"targt": 1}})  # 422
    yield http.post(f"{url}/reset", json={"task_id": "test/0"})  # 404 task_not_found
    yield http.post(f"{url}/reset", json={"options": {"refuse": "x" * MAX_BODY}})  # 413
    yield http.post(f"{url}/format", json={"observation": {"text": "t", "images": []}})
    yield http.post(f"{url}/format", json={"observation": {"images": ["data:image/png;base64,aGk="]}})  # 422
    first = http.post(f"{url}/reset", json={"options": {"target": 2, "fail_on": "boom"}})
    yield first
    session = first.json()["session_id"]
    yield http.post(f"{url}/reset", json={"session_id": session})  # 409 session_exists
    other = http.post(f"{url}/reset", json={})
    yield other
    yield http.post(f"{url}/reset", json={})  # 503 at_capacity
    yield http.get(f"{url}/ready")  # 503 with the ready object
    yield http.delete(f"{url}/sessions/{other.json()['session_id']}")  # 204
    yield http.delete(f"{url}/sessions/{other.json()['session_id']}")  # 404
    yield http.post(f"{url}/step", json={"session_id": "nobody", "action": "inc"})  # 404
    yield http.post(f"{url}/step", json={"session_id": session})  # 422
    yield http.post(f"{url}/step", json={"session_id": session, "action": "boom"})  # 500
    yield http.post(f"{url}/step", json={"session_id": session, "action": "inc", "request_id": "r"})
    yield http.post(f"{url}/step", json={"session_id": session, "action": "dec", "request_id": "r"})  # 409
    yield http.post(f"{url}/step", json={"session_id": session, "action": "inc"})  # done
    yield http.post(f"{url}/step", json={"session_id": session, "action": "inc"})  # 409 episode_done
    yield http.delete(f"{url}/sessions/{session}")


def test_every_answer_is_valid_against_the_published_schema(http: requests.Session, url: str) -> None:
    spec = OpenAPI.from_dict(http.get(f"{url}/openapi.json").json())
    answers = list(exchange(http, url))
    for answer in answers:
        request = answer.request
        try:
            spec.validate_response(RequestsOpenAPIRequest(request), RequestsOpenAPIResponse(answer))
        except Exception as exc:
            raise AssertionError(
                f"{request.method} {request.url} -> {answer.status_code} {answer.text}"
            ) from exc
        if answer.status_code >= 400:
            message = answer.json()["error"]["message"] if answer.status_code != 503 else ""
            assert " object at 0x" not in message  # words, not Python reprs
    statuses = sorted({answer.status_code for answer in answers})
    assert statuses == [200, 204, 400, 401, 404, 409, 413, 422, 500, 503]


def test_the_schema_declares_the_bearer_scheme_errors_and_prometheus_text(
    http: requests.Session, url: str
) -> None:
    schema = http.get(f"{url}/openapi.json").json()
    bearer = schema["components"]["securitySchemes"]["bearer"]
    assert set(bearer) == {"type", "scheme", "description"}
    assert (bearer["type"], bearer["scheme"]) == ("http", "bearer")
    assert bearer["description"].startswith("Authorization: Bearer <token> when the server has one;")
    paths = schema["paths"]
    open_paths = {path for path, item in paths.items() if not any("security" in op for op in item.values())}
    named_open = set(re.findall(r"/\w+", bearer["description"].split(" are open")[0]))
    assert named_open == open_paths == {"/health", "/ready", "/metrics", "/schema", "/metadata"}
    for path in open_paths:  # what the description calls open is open on a server with a token
        assert requests.get(f"{url}{path}", timeout=TIMEOUT).status_code != 401, path
    assert paths["/info"]["get"]["security"] == [{"bearer": []}]
    assert set(paths["/metrics"]["get"]["responses"]["200"]["content"]) == {"text/plain"}
    step = paths["/step"]["post"]["responses"]
    assert {"400", "401", "404", "409", "413", "422", "500", "default"} <= set(step)
    assert step["422"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorResponse")
    assert "HTTPValidationError" not in schema["components"]["schemas"]
    ready = paths["/ready"]["get"]["responses"]["503"]
    assert ready["content"]["application/json"]["schema"]["$ref"].endswith("/ReadyResponse")


def test_the_schema_is_served_without_a_token(url: str) -> None:
    assert requests.get(f"{url}/info", timeout=TIMEOUT).status_code == 401
    schema = requests.get(f"{url}/openapi.json", timeout=TIMEOUT)
    assert schema.status_code == 200 and "/step" in schema.json()["paths"]


def test_ready_at_503_is_the_ready_object(http: requests.Session, url: str) -> None:
    sessions = [http.post(f"{url}/reset", json={}).json()["session_id"] for _ in range(2)]
    full = http.get(f"{url}/ready")
    assert full.status_code == 503
    assert full.headers["retry-after"] == "2"
    assert full.json() == {"ready": False, "active_sessions": 2, "max_sessions": 2, "draining": False}
    for session in sessions:
        http.delete(f"{url}/sessions/{session}")
    assert http.get(f"{url}/ready").json()["ready"] is True


@pytest.mark.parametrize("scheme", ["bearer", "BEARER", "Bearer", "bEaReR"])
def test_the_bearer_scheme_name_is_case_insensitive(url: str, scheme: str) -> None:
    assert requests.get(f"{url}/info", headers={"Authorization": f"{scheme} {TOKEN}"}, timeout=TIMEOUT).ok


@pytest.mark.parametrize("authorization", [TOKEN, f"Basic {TOKEN}", f"Bearer {TOKEN}x", f"Bearer{TOKEN}", ""])
def test_other_credentials_are_refused(url: str, authorization: str) -> None:
    refused = requests.get(f"{url}/info", headers={"Authorization": authorization}, timeout=TIMEOUT)
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "unauthorized"


def test_a_browser_preflight_passes_without_a_token(url: str) -> None:
    preflight = {
        "Origin": ORIGIN,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type",
    }
    allowed = requests.options(f"{url}/reset", headers=preflight, timeout=TIMEOUT)
    assert allowed.status_code == 200
    assert allowed.headers["access-control-allow-origin"] == ORIGIN
    assert "POST" in allowed.headers["access-control-allow-methods"]
    assert "authorization" in allowed.headers["access-control-allow-headers"].lower()

    stranger = requests.options(
        f"{url}/reset", headers={**preflight, "Origin": "https://evil.example"}, timeout=TIMEOUT
    )
    assert stranger.status_code == 400
    assert "access-control-allow-origin" not in stranger.headers

    answer = requests.get(f"{url}/info", headers={**AUTH, "Origin": ORIGIN}, timeout=TIMEOUT)
    assert answer.headers["access-control-allow-origin"] == ORIGIN
    refusal = requests.get(f"{url}/info", headers={"Origin": ORIGIN}, timeout=TIMEOUT)  # readable by the page
    assert (refusal.status_code, refusal.headers["access-control-allow-origin"]) == (401, ORIGIN)
