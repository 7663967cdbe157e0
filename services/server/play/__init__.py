"""The browser playground of an env server (docs/server.md, "Playground"): `GET /play` plays episodes
through the server's own HTTP API, `GET /play/replay` steps through trajectory files in the browser.

The pages are plain HTML, JavaScript and CSS files of this package, served as they are (no build
step): each page is `page.html` around its body (`play.html`, `replay.html`), loading `play.css`,
`common.js` and its script; `favicon.svg` is their icon, also at `/favicon.ico`, where browsers look
for one. They are static and hold nothing of a session, so the request guard lets
them through without a token; the play page sends the token that a person types in with each API call.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from importlib import resources
from string import Template

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

ASSET_ROOT = "/play"
MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
ICON = "favicon.svg"
ICON_PATH = "/favicon.ico"


@dataclass(frozen=True)
class Page:
    path: str
    title: str
    body: str
    script: str


PAGES = (
    Page("/play", "vistarl playground", "play.html", "play.js"),
    Page("/play/replay", "vistarl replay", "replay.html", "replay.js"),
)
ASSETS = ("common.js", "play.js", "replay.js", "play.css", ICON)
PLAY_PATHS = frozenset(
    [page.path for page in PAGES] + [f"{ASSET_ROOT}/{name}" for name in ASSETS] + [ICON_PATH]
)


def play_routes() -> list[BaseRoute]:
    """A GET route for each page and asset, and the icon at `/favicon.ico`, answering what was read once,
    here. None is in the OpenAPI schema, which describes the JSON API."""
    pages: list[BaseRoute] = [_route(page.path, _render(page), MEDIA_TYPES[".html"]) for page in PAGES]
    served = [(f"{ASSET_ROOT}/{name}", name) for name in ASSETS] + [(ICON_PATH, ICON)]
    assets = [_route(path, _read(name), MEDIA_TYPES[posixpath.splitext(name)[1]]) for path, name in served]
    return pages + assets


def _render(page: Page) -> bytes:
    """`page.html` around the page's body, its assets addressed relative to the page's own path."""
    assets = posixpath.relpath(ASSET_ROOT, posixpath.dirname(page.path)) + "/"
    shell = Template(_read("page.html").decode())
    body = _read(page.body).decode()
    return shell.substitute(title=page.title, assets=assets, body=body, script=page.script).encode()


def _read(name: str) -> bytes:
    return (resources.files(__name__) / name).read_bytes()


def _route(path: str, body: bytes, media_type: str) -> Route:
    async def serve(request: Request) -> Response:
        return Response(body, media_type=media_type, headers={"Cache-Control": "no-cache"})

    return Route(path, serve, methods=["GET"], include_in_schema=False)
