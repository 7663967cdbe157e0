"""A server's Prometheus metrics, kept in a registry of its own, and the error counter every server has.

A per-app `CollectorRegistry` lets several servers live in one process (tests, embedded use) without
their metric names colliding in the global registry.
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
from starlette.responses import Response


class ServingMetrics:
    """A registry of one server's own, with `errors`: the error answers by code, named `<prefix>_errors`.
    Servers add their own metrics to `registry`."""

    def __init__(self, prefix: str) -> None:
        self.registry = CollectorRegistry()
        self.errors = Counter(
            f"{prefix}_errors", "Error answers, by error code.", ["code"], registry=self.registry
        )

    def response(self) -> Response:
        """The answer of a `GET /metrics`: the registry in the Prometheus text format."""
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)
