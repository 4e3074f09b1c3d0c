"""Build the platform's parts from settings: the only place that picks implementations.

Imports of the parts happen inside the functions, so a CLI command that needs none of them
(``cascade version``, ``--help``) does not pay for the web stack and the clients.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cascade.core.settings import Settings
    from cascade.events.bus import EventBus
    from cascade.events.identity import Authenticator
    from cascade.stores import StateStore

TOKEN_FILE = "token"


def bus(settings: Settings) -> EventBus:
    from cascade.events.bus import open_bus

    return open_bus(settings.bus_url, partitions=settings.bus.partitions, session_timeout=settings.bus.session_timeout)


def store(settings: Settings) -> StateStore:
    from cascade.stores import open_store

    return open_store(settings.state_url)


def function_dirs(settings: Settings) -> list[Path]:
    """The user's function folders plus the platform's own functions."""
    from cascade.functions.platform import PLATFORM_FUNCTIONS

    return [*settings.function_paths, PLATFORM_FUNCTIONS]


def authenticator(state: StateStore, platform_token: str) -> Authenticator:
    """Who is calling, for every server: project tokens from the state store, and the platform credential."""
    from cascade.events.identity import Authenticator, Projects

    return Authenticator(Projects(state), platform_token)


def guarded(settings: Settings, app: Any, listen: str, max_body: int | None = None) -> Any:
    """``app`` behind the HTTP guard: hosts this server answers, body limit, control characters."""
    from cascade.core.httpguard import HTTPGuard

    return HTTPGuard(app, hosts=settings.allowed_hosts(listen), max_body=max_body or settings.security.max_body_bytes)


def token_path(settings: Settings) -> Path:
    return settings.home / TOKEN_FILE


def bootstrap_default_project(settings: Settings, state: StateStore) -> str | None:
    """On a fresh home, create project ``default`` and a token saved to ``HOME/token``.

    Returns the new token, or None when the home already has one.
    """
    path = token_path(settings)
    if path.exists():
        return None
    from cascade.events.identity import Projects

    projects = Projects(state)
    projects.create_project("default")
    token = projects.create_token("default", "created by cascade up")
    settings.home.mkdir(parents=True, exist_ok=True)
    path.write_text(token + "\n")
    path.chmod(0o600)
    return token


def saved_token(settings: Settings) -> str | None:
    path = token_path(settings)
    return path.read_text().strip() if path.exists() else None
