"""A client of the function runtime's admin API (``/_runtime/...``), for the CLI and the dashboard."""

from __future__ import annotations

from typing import Any

from cascade.core.credentials import auth_header


def runtime_admin(runtime_url: str, path: str, token: str, timeout: float = 2.0) -> Any:
    """What the runtime answers at ``path`` (``/_runtime/services``, ``/_runtime/models``), or None when it does not.

    ``token`` is the platform credential (the admin API takes no other)."""
    import httpx

    try:
        reply = httpx.get(runtime_url + path, headers=auth_header(token), timeout=timeout)
        return reply.json() if reply.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
