"""A client of the function runtime's admin API (``/_runtime/...``), for the CLI and the dashboard."""

from __future__ import annotations

from typing import Any


def runtime_admin(runtime_url: str, path: str, timeout: float = 2.0) -> Any:
    """What the runtime answers at ``path`` (``/_runtime/services``, ``/_runtime/models``), or None when it does not."""
    import httpx

    try:
        return httpx.get(runtime_url + path, timeout=timeout).json()
    except (httpx.HTTPError, ValueError):
        return None
