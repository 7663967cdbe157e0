"""The env server's access policy: the paths that need no bearer token, the path whose route checks it
itself, and the CORS options that let browser pages of chosen origins call it. The guard that enforces
auth and the body limit is `vistarl.httpserver.guard.RequestGuard`, shared with the engine server.

The probe and scrape paths stay open with a token set (docs/server.md, "Authentication"): Kubernetes
probes and Prometheus send no token, and these paths reveal only counts, never a session or an observation.
So do the paths that describe the env or the wire and no session, as OpenEnv's server leaves them open:
`/openapi.json` (so that clients can be generated from it), and OpenEnv's `/schema` and `/metadata`.
`/mcp` checks the token itself, message by message (`mcp_route.py`): a body that is no JSON-RPC message
gets its JSON-RPC error without one, as `openenv validate` asks.
"""

from __future__ import annotations

from typing import Any

OPEN_PATHS = frozenset({"/health", "/ready", "/metrics", "/openapi.json", "/schema", "/metadata"})
MCP_PATH = "/mcp"
ROUTE_GUARDED_PATHS = frozenset({MCP_PATH})
"""Paths the request guard lets through without a token because their route checks it."""
MCP_HEADERS = ("mcp-protocol-version", "mcp-session-id", "mcp-method", "mcp-name", "last-event-id")


def cors_options(origins: list[str]) -> dict[str, Any]:
    """Starlette `CORSMiddleware` options for browser pages of `origins` (docs/server.md, "Browsers"):
    the methods and headers of the env API and of MCP's streamable HTTP, and `Retry-After` and MCP's
    session header readable by the page."""
    return {
        "allow_origins": origins,
        "allow_methods": ["GET", "POST", "DELETE"],
        "allow_headers": [*MCP_HEADERS, "authorization", "content-type"],
        "expose_headers": ["retry-after", "mcp-session-id"],
    }
