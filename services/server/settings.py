"""Environment-server settings: one pydantic model, filled from CLI flags and `VISTARL_*` variables.

Precedence, highest first: values passed to `ServerSettings(...)` (the CLI flags), then environment
variables (`VISTARL_MAX_SESSIONS=64`, `VISTARL_API_TOKEN=...`), then the defaults below.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from vistarl.clients.protocol import Limits

REDIS_SCHEMES = ("redis:", "rediss:", "unix:")

LogLevel = Literal["critical", "error", "warning", "info", "debug", "trace"]


CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")


def usable_cores(cpu_max: Path = CGROUP_CPU_MAX) -> int:
    """The cores this process may use: those of its CPU affinity (which `taskset` and cpusets narrow),
    fewer under a cgroup v2 CPU quota (a container's CPU limit), rounded up."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        quota, period = cpu_max.read_text().split()
        return max(1, min(cores, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):  # no cgroup v2 file, or "max": no quota
        return cores


def default_env_workers() -> int:
    """One env worker process per usable core; none (envs in threads) on a single core, where a worker
    would only add a hop."""
    cores = usable_cores()
    return cores if cores > 1 else 0


class ServerSettings(BaseSettings):
    """How one environment server listens, how many sessions it keeps, and the bounds it enforces."""

    model_config = SettingsConfigDict(env_prefix="VISTARL_", env_ignore_empty=True, extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    log_level: LogLevel = "info"
    access_log: bool = Field(default=False, description="Log one line per request (uvicorn's access log).")
    keep_alive_s: int = Field(
        default=65,
        ge=1,
        description="Idle seconds before a keep-alive connection closes; above the 60 s of common proxies.",
    )
    otel: bool = Field(
        default=False,
        description="FastAPI's OpenTelemetry spans, metrics and logs per request, via the global providers.",
    )

    max_sessions: int = Field(default=256, ge=1, description="Live sessions; more resets get 503.")
    session_ttl_s: float = Field(default=600.0, gt=0, description="Idle time after which a session expires.")
    reaper_interval_s: float = Field(default=10.0, gt=0, description="How often expired sessions are reaped.")
    retry_after_s: int = Field(default=1, ge=1, description="The Retry-After header of 503 answers.")
    session_store: str | None = Field(
        default=None,
        description="Where sessions live: unset keeps them in this process; a redis:// URL shares them, env "
        "states included, between the replicas of one env (docs/server.md, 'Session store').",
    )
    tombstone_ttl_s: float = Field(
        default=60.0,
        gt=0,
        description="Seconds a finished session still answers 409 episode_done and replays its final step.",
    )

    max_body_bytes: int = Field(default=16 * 1024 * 1024, ge=1024, description="Request body limit (413).")
    max_image_bytes: int = Field(default=8 * 1024 * 1024, ge=1, description="Decoded size of one image.")
    max_image_pixels: int = Field(default=4096 * 4096, ge=1, description="Width x height of one image.")
    max_action_chars: int = Field(default=32_768, ge=1, description="Length of a step's action (422).")

    idempotency_cache_size: int = Field(default=64, ge=1, description="Stored step answers per session.")
    env_workers: int = Field(
        default_factory=default_env_workers,
        ge=0,
        le=256,
        description="Env worker processes, each session in the one that reset it; 0 runs envs in threads. "
        "Default: the usable cores, or 0 on one core.",
    )
    env_threads: int = Field(
        default=32, ge=1, description="Threads that run env code off the event loop (with env_workers=0)."
    )
    env_timeout_s: float = Field(default=60.0, gt=0, description="Bound on one env call (reset/step/format).")
    shutdown_timeout_s: float = Field(
        default=10.0, gt=0, description="Grace for in-flight requests and close."
    )

    data: list[Path] = Field(
        default_factory=list,
        description="Datasets whose splits the server serves besides the env's own: directories of "
        "<split>.parquet files or single parquet files (docs/server.md, 'Tasks').",
    )

    api_token: SecretStr | None = Field(
        default=None, description="Bearer token required on all but /health, /ready and /metrics."
    )
    cors_origins: list[str] = Field(
        default_factory=list,
        description="Browser origins allowed to call the server (CORS), e.g. https://app.example, or '*'.",
    )

    @field_validator("session_store")
    @classmethod
    def _redis_url(cls, url: str | None) -> str | None:
        """Only Redis URLs name a shared store."""
        if url is not None and not url.startswith(REDIS_SCHEMES):
            schemes = ", ".join(f"{scheme}//" for scheme in REDIS_SCHEMES)
            raise ValueError(f"session_store: expected a Redis URL ({schemes}...), got {url!r}")
        return url

    def limits(self) -> Limits:
        """The bounds published in `GET /info`."""
        return Limits(
            max_sessions=self.max_sessions,
            session_ttl_s=self.session_ttl_s,
            max_body_bytes=self.max_body_bytes,
            max_image_bytes=self.max_image_bytes,
            max_image_pixels=self.max_image_pixels,
            max_action_chars=self.max_action_chars,
            idempotency_cache_size=self.idempotency_cache_size,
            env_timeout_s=self.env_timeout_s,
            retry_after_s=self.retry_after_s,
        )
