"""The session store: `base` (interface, records), `memory` (one process) and `redis` (shared by replicas)."""

from __future__ import annotations

from vistarl.services.server.settings import ServerSettings
from vistarl.services.server.store.base import Retention, SessionStore
from vistarl.services.server.store.memory import InMemorySessionStore

__all__ = ["create_store"]


def create_store(settings: ServerSettings, env_name: str) -> SessionStore:
    """The store that `settings.session_store` names: Redis at that URL, else one in this process."""
    retention = Retention(settings.session_ttl_s, settings.tombstone_ttl_s, settings.idempotency_cache_size)
    if settings.session_store is None:
        return InMemorySessionStore(retention)
    from vistarl.services.server.store.redis import RedisSessionStore  # redis is needed only for this store

    return RedisSessionStore(settings.session_store, env_name, retention, settings.retry_after_s)
