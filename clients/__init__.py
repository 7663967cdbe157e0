"""What an external agent installs: the wire protocol, the image codec and the HTTP clients. No torch.

The HTTP clients (`vistarl.clients.http`, with aiohttp and httpx) are imported on first use, so that a server,
which needs only the protocol, starts without them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from vistarl.clients.errors import (
    AuthError,
    BadRequestError,
    EnvClientError,
    EnvConnectionError,
    EnvServerError,
    EpisodeDoneError,
    ImageError,
    PayloadTooLargeError,
    ProtocolError,
    RequestIdReusedError,
    ServerBusyError,
    ServerError,
    SessionExistsError,
    SessionNotFoundError,
    TaskNotFoundError,
)
from vistarl.clients.images import decode_image, encode_image

if TYPE_CHECKING:
    from vistarl.clients.http import AsyncEnvClient, AsyncEpisode, EnvClient, Episode, RetryPolicy

__all__ = [
    "AsyncEnvClient",
    "AsyncEpisode",
    "AuthError",
    "BadRequestError",
    "EnvClient",
    "EnvClientError",
    "EnvConnectionError",
    "EnvServerError",
    "Episode",
    "EpisodeDoneError",
    "ImageError",
    "PayloadTooLargeError",
    "ProtocolError",
    "RequestIdReusedError",
    "RetryPolicy",
    "ServerBusyError",
    "ServerError",
    "SessionExistsError",
    "SessionNotFoundError",
    "TaskNotFoundError",
    "decode_image",
    "encode_image",
]

HTTP_CLIENTS = frozenset({"AsyncEnvClient", "AsyncEpisode", "EnvClient", "Episode", "RetryPolicy"})


def __getattr__(name: str) -> Any:
    """`clients.AsyncEnvClient` and the other names of `vistarl.clients.http`, imported on first use."""
    if name in HTTP_CLIENTS:
        return getattr(importlib.import_module("vistarl.clients.http"), name)
    raise AttributeError(f"module 'clients' has no attribute {name!r}")
