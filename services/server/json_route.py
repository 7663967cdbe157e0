"""The env endpoints (/reset, /step, /format, DELETE /sessions/{id}) on a lean path through FastAPI.

Per request, FastAPI's own handler (dependency solving, `json.loads` then validation, response-model
validation and re-encoding) costs more than a Sokoban step. A `JSONRoute` is built and documented from its
endpoint's signature, `response_model` and `responses` like any FastAPI route, but its handler (from
FastAPI's `get_route_handler` hook) serves the endpoint directly: the raw body is validated by
`model_validate_json`, and the endpoint answers with the JSON body itself, encoded where the env ran.
Route dependencies are not run, so a lean route may declare only those that can never refuse a request (a
security scheme with `auto_error=False`: the bearer token that the request guard enforces before routing,
declared for the OpenAPI schema); any other dependency is a TypeError when the route is built, naming it
(`check_lean`). Bad bodies raise `ServiceError`s for the app's error handlers, in FastAPI's shapes: 400
for malformed JSON, 422 naming each invalid field (`body.session_id: Field required`).

`LeanRoutes` goes one step further for the calls of every episode: a middleware just inside the request
guard that serves them with the same handlers before FastAPI's router sees them, and answers their errors
with the app's own exception handlers. It takes the app's routes themselves (its `JSONRoute`s and `DELETE
/sessions/{session_id}`), each passed through `check_lean` when the app starts, so the lean path serves
nothing that the router would guard differently. Matching seven routes, FastAPI's routing, its exception
middleware and its request wrapper cost more per request than the rest of the server process's work (in
docs/benchmarks.md's history, `git show 51199ab:docs/benchmarks.md`, "Second round"). Every other request,
and these on any other method or path, go on to the router unchanged.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping, Sequence
from typing import Any

from fastapi import Request, Response
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from fastapi.security.base import SecurityBase
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from vistarl.clients.protocol import ErrorCode
from vistarl.httpserver.errors import ServiceError, invalid_body

JSON_MEDIA_TYPE = "application/json"

Endpoint = Callable[[Any], Awaitable[bytes]]
Handler = Callable[[Request], Coroutine[Any, Any, Response]]
ErrorHandler = Callable[..., Any]
"""An app exception handler: `(request, exc)` to a response, or to an awaitable of one (Starlette's rule)."""
SESSION_PREFIX = "/sessions/"
DELETE_SESSION = SESSION_PREFIX + "{session_id}"


class JSONRoute(APIRoute):
    """A route for `async def endpoint(body: RequestModel) -> bytes` (a JSON body of `response_model`),
    served without FastAPI's dependency solving and response-model handling. Register it with
    `router.add_api_route(..., response_model=ResponseModel, route_class_override=JSONRoute)`.
    """

    def __init__(self, path: str, endpoint: Endpoint, **kwargs: Any) -> None:
        self.body_model = body_model(endpoint)
        super().__init__(path, endpoint, **kwargs)
        check_lean(self)

    def get_route_handler(self) -> Handler:
        """The handler FastAPI wraps for this route: body in, endpoint, JSON answer out."""
        return json_handler(self.endpoint)


def check_lean(route: APIRoute) -> None:
    """A TypeError naming each dependency of `route` that FastAPI would run and the lean path skips:
    anything but a security scheme that never refuses (`auto_error=False`, declared for the schema)."""
    skipped = [
        _name(dependant.call) for dependant in _dependencies(route.dependant) if not _declared_only(dependant)
    ]
    if skipped:
        raise TypeError(
            f"{route.path} is served on the lean path, which runs no dependencies, but declares "
            f"{', '.join(skipped)}: check it in the endpoint or the request guard, or serve the route "
            "through FastAPI's router"
        )


def _dependencies(dependant: Dependant) -> Iterator[Dependant]:
    """Every dependency below `dependant`, at any depth."""
    for child in dependant.dependencies:
        yield child
        yield from _dependencies(child)


def _declared_only(dependant: Dependant) -> bool:
    """Whether a dependency only declares a security scheme: it can never refuse a request."""
    call = dependant.call
    return isinstance(call, SecurityBase) and getattr(call, "auto_error", True) is False


def _name(call: Any) -> str:
    """A dependency's name, for the error."""
    return getattr(call, "__name__", None) or type(call).__name__


def body_model(endpoint: Endpoint) -> type[BaseModel]:
    """The pydantic model of an endpoint's one parameter; a TypeError for any other signature."""
    params = [hint for name, hint in typing.get_type_hints(endpoint).items() if name != "return"]
    if len(params) != 1 or not (isinstance(params[0], type) and issubclass(params[0], BaseModel)):
        raise TypeError(f"{endpoint.__name__} must take one pydantic model, not {params}")
    model: type[BaseModel] = params[0]
    return model


def json_handler(endpoint: Endpoint) -> Handler:
    """Serve `endpoint`: its body model read from the request, its JSON bytes as the answer."""
    model = body_model(endpoint)

    async def handle(request: Request) -> Response:
        return Response(await endpoint(await read_json(request, model)), media_type=JSON_MEDIA_TYPE)

    return handle


class LeanRoutes:
    """Pure ASGI middleware serving, of the app's `routes`, each `JSONRoute` (by its JSON endpoint) and
    `DELETE /sessions/{session_id}` itself; their errors are answered by the app's exception `handlers` (by
    class, as FastAPI's exception middleware picks them), and any other exception goes on up to the app's
    server-error middleware. Add it inside the request guard, which has already checked the token and the
    declared body size."""

    def __init__(
        self, app: ASGIApp, *, routes: Sequence[BaseRoute], handlers: Mapping[Any, ErrorHandler]
    ) -> None:
        self.app = app
        api_routes = [route for route in routes if isinstance(route, APIRoute)]
        self.posts = {
            route.path: json_handler(route.endpoint)
            for route in api_routes
            if isinstance(route, JSONRoute) and "POST" in (route.methods or ())
        }
        delete = next(r for r in api_routes if r.path == DELETE_SESSION and "DELETE" in (r.methods or ()))
        check_lean(delete)
        self.delete_session: Callable[[str], Coroutine[Any, Any, Response]] = delete.endpoint
        self.handlers = handlers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        handle = self._handler(scope) if scope["type"] == "http" and not scope.get("root_path") else None
        if handle is None:
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        try:
            response = await handle(request)
        except Exception as exc:
            on_error = self._on_error(exc)
            if on_error is None:
                raise
            answer = on_error(request, exc)
            response = await answer if inspect.isawaitable(answer) else answer
        await response(scope, receive, send)

    def _handler(self, scope: Scope) -> Handler | None:
        """The handler of this method and path, or None for the router to route it."""
        method, path = scope["method"], scope["path"]
        if method == "POST":
            return self.posts.get(path)
        session_id = path.removeprefix(SESSION_PREFIX)
        if method != "DELETE" or session_id == path or not session_id or "/" in session_id:
            return None
        return lambda _: self.delete_session(session_id)

    def _on_error(self, exc: Exception) -> ErrorHandler | None:
        """The app's handler for the nearest class of `exc` that has one, short of `Exception` itself."""
        for cls in type(exc).__mro__:
            if cls is Exception:
                return None
            if cls in self.handlers:
                return self.handlers[cls]
        return None


async def read_json(request: Request, model: type[BaseModel]) -> BaseModel:
    """The request's JSON body as `model`, or a `ServiceError` (400 malformed, 422 invalid or not JSON).

    The body is read once; its size is already bounded by `vistarl.httpserver.guard.RequestGuard`.
    """
    try:
        body = await _body(request.receive)
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


async def _body(receive: Receive) -> bytes:
    """The whole body, straight from the ASGI messages (Starlette's `Request.body` goes through an async
    generator per request); `ClientDisconnect` if the client leaves first."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _is_json(content_type: str) -> bool:
    """Whether a Content-Type names JSON (`application/json`, `application/*+json`, any parameters)."""
    media_type = content_type.partition(";")[0].strip().lower()
    suffixed = media_type.startswith("application/") and media_type.endswith("+json")
    return media_type == JSON_MEDIA_TYPE or suffixed
