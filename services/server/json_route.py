"""`JSONRoute`: the env endpoints (/reset, /step, /format) on a lean path through FastAPI.

Per request, FastAPI's own handler (dependency solving, `json.loads` then validation, response-model
validation and re-encoding) costs more than a Sokoban step. A `JSONRoute` is built and documented from
its endpoint's signature, `response_model` and `responses` like any FastAPI route, but its handler (from
FastAPI's `get_route_handler` hook) serves the endpoint directly: the raw body is validated by
`model_validate_json`, and the endpoint answers with the JSON body itself, encoded where the env ran.
Route dependencies are documented but not run (the request guard does the auth they declare). Bad
bodies raise `ServiceError`s for the app's error handlers, in FastAPI's shapes: 400 for malformed JSON,
422 naming each invalid field (`body.session_id: Field required`).
"""

from __future__ import annotations

import typing
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect

from clients.protocol import ErrorCode
from serving.errors import ServiceError, invalid_body

JSON_MEDIA_TYPE = "application/json"

Endpoint = Callable[[Any], Awaitable[bytes]]


class JSONRoute(APIRoute):
    """A route for `async def endpoint(body: RequestModel) -> bytes` (a JSON body of `response_model`),
    served without FastAPI's dependency solving and response-model handling. Register it with
    `router.add_api_route(..., response_model=ResponseModel, route_class_override=JSONRoute)`.
    """

    def __init__(self, path: str, endpoint: Endpoint, **kwargs: Any) -> None:
        params = [hint for name, hint in typing.get_type_hints(endpoint).items() if name != "return"]
        if len(params) != 1 or not (isinstance(params[0], type) and issubclass(params[0], BaseModel)):
            raise TypeError(f"{endpoint.__name__} must take one pydantic model, not {params}")
        self.body_model: type[BaseModel] = params[0]
        super().__init__(path, endpoint, **kwargs)

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        """The handler FastAPI wraps for this route: body in, endpoint, JSON answer out."""
        endpoint, body_model = self.endpoint, self.body_model

        async def handle(request: Request) -> Response:
            return Response(await endpoint(await read_json(request, body_model)), media_type=JSON_MEDIA_TYPE)

        return handle


async def read_json(request: Request, model: type[BaseModel]) -> BaseModel:
    """The request's JSON body as `model`, or a `ServiceError` (400 malformed, 422 invalid or not JSON).

    The body is read once; its size is already bounded by `serving.guard.RequestGuard`.
    """
    try:
        body = await request.body()
    except ClientDisconnect:
        raise ServiceError(ErrorCode.BAD_REQUEST, "the client left before sending the whole body") from None
    if not body:
        raise ServiceError(ErrorCode.VALIDATION_ERROR, "body: Field required")
    content_type = request.headers.get("content-type", "")
    if not _is_json(content_type):
        message = f"body: expected Content-Type {JSON_MEDIA_TYPE}, got {content_type or 'none'}"
        raise ServiceError(ErrorCode.VALIDATION_ERROR, message)
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        raise invalid_body(exc.errors(include_url=False), prefix="body") from None


def _is_json(content_type: str) -> bool:
    """Whether a Content-Type names JSON (`application/json`, `application/*+json`, any parameters)."""
    media_type = content_type.partition(";")[0].strip().lower()
    suffixed = media_type.startswith("application/") and media_type.endswith("+json")
    return media_type == JSON_MEDIA_TYPE or suffixed
