"""The state store plug-in point: the protocol (``base``), one module per backend, one factory.

``open_store(url)`` picks the backend by URL scheme and imports only that backend's client,
so the embedded default never loads ``redis``.
"""

from __future__ import annotations

from cascade.core.errors import InvalidInput
from cascade.stores.base import StateStore, index_values

__all__ = ["StateStore", "index_values", "open_store"]


def open_store(url: str) -> StateStore:
    """``sqlite:///abs/state.db``, ``sqlite://relative/state.db`` or ``redis://host:port/db``."""
    if url.startswith("redis://") or url.startswith("rediss://"):
        from cascade.stores.redis import RedisStore

        return RedisStore(url)
    if url.startswith("sqlite://"):
        from cascade.stores.sqlite import SqliteStore

        return SqliteStore(url[len("sqlite://"):])  # sqlite:///abs/path or sqlite://relative/path
    raise InvalidInput(f"state URL {url!r}: use sqlite:///PATH or redis://HOST:PORT/DB", field="state")
