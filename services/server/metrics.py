"""Prometheus metrics of one environment server, in the registry of its own that `vistarl.httpserver.metrics`
gives every server."""

from __future__ import annotations

import functools

from prometheus_client import Counter, Gauge, Histogram

from vistarl.httpserver.metrics import ServingMetrics

STEP_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class ServerMetrics(ServingMetrics):
    """The counters, gauges and histogram that `GET /metrics` exposes, errors (`vistarl_env_errors`)
    included."""

    def __init__(self) -> None:
        super().__init__("vistarl_env")
        counter = functools.partial(Counter, registry=self.registry)
        gauge = functools.partial(Gauge, registry=self.registry)
        self.active_sessions = gauge("vistarl_env_active_sessions", "Sessions currently held by this server.")
        self.resets = counter("vistarl_env_resets", "Episodes started with /reset.")
        self.steps = counter("vistarl_env_steps", "Environment steps taken.")
        self.step_seconds = Histogram(
            "vistarl_env_step_seconds",
            "Time spent in one environment step, including image encoding.",
            buckets=STEP_BUCKETS,
            registry=self.registry,
        )
        self.expired_sessions = counter(
            "vistarl_env_expired_sessions", "Envs closed by the reaper because their session expired."
        )
        self.restored_sessions = counter(
            "vistarl_env_restored_sessions",
            "Envs rebuilt here from the shared session store's state (a session new to this replica, or "
            "one stepped elsewhere since).",
        )
        self.env_workers = gauge(
            "vistarl_env_workers", "Env worker processes running (0 with envs in threads)."
        )
        self.env_worker_restarts = counter(
            "vistarl_env_worker_restarts", "Env worker processes replaced after exiting."
        )
