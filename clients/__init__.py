"""What an external agent installs: the wire protocol, the image codec and the HTTP clients. No torch."""

from clients.errors import (
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
from clients.http import AsyncEnvClient, AsyncEpisode, EnvClient, Episode, RetryPolicy
from clients.images import decode_image, encode_image

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
