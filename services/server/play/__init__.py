"""The browser playground of an env server (docs/server.md, "Playground"): `GET /play` plays episodes
through the server's own HTTP API, `GET /play/replay` steps through trajectory files in the browser.

The pages are plain HTML, JavaScript and CSS files of this package, served as they are: no build step.
They are static and hold nothing of a session, so the request guard lets them through without a token;
the play page sends the token that a person types in with each API call.
"""

from __future__ import annotations

from importlib import resources

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
}
PAGES = {"/play": "play.html", "/play/replay": "replay.html"}
ASSETS = ("play.js", "replay.js", "play.css")
FILES = {**PAGES, **{f"/play/{name}": name for name in ASSETS}}
PLAY_PATHS = frozenset(FILES)


def play_routes() -> list[BaseRoute]:
    """A GET route for each page and asset, answering the file read once, here; none is in the OpenAPI
    schema, which describes the JSON API."""
    return [_route(path, name) for path, name in FILES.items()]


def _route(path: str, name: str) -> Route:
    body = (resources.files(__name__) / name).read_bytes()
    media_type = MEDIA_TYPES[name[name.rfind(".") :]]

    async def serve(request: Request) -> Response:
        return Response(body, media_type=media_type, headers={"Cache-Control": "no-cache"})

    return Route(path, serve, methods=["GET"], include_in_schema=False)
