"""Projects and their API tokens, kept hashed in the state store.

A token is shown once, when created; the store keeps only its SHA-256. Every event a token
publishes gets the token's ``project`` extension, so project A's token cannot publish into
project B. Lookups are cached for a few seconds to keep the store off the hot path.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from datetime import datetime, timezone

from cascade.core.errors import InvalidInput, NotFound
from cascade.stores import StateStore

_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")  # a Kubernetes namespace name


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Projects:
    """Project and token records over a StateStore."""

    def __init__(self, store: StateStore, *, cache_seconds: float = 5.0) -> None:
        self.store = store
        self.cache_seconds = cache_seconds
        self._cache: dict[str, tuple[str | None, float]] = {}

    def create_project(self, name: str) -> dict[str, str]:
        if not _NAME.match(name):
            raise InvalidInput(
                f"project name {name!r} must be lowercase letters, digits and '-', at most 63 characters "
                "(it becomes a Kubernetes namespace)", field="name")
        existing = self.store.get_record("project", name)
        if existing:
            return existing
        doc = {"name": name, "created": datetime.now(timezone.utc).isoformat()}
        self.store.put_record("project", name, doc)
        return doc

    def list_projects(self) -> list[dict[str, str]]:
        return self.store.find_records("project")

    def create_token(self, project: str, description: str = "") -> str:
        """A new token for ``project``; the only time the plain token is available."""
        if not self.store.get_record("project", project):
            raise NotFound(f"project {project!r} does not exist; create it with: cascade projects create {project}")
        token = f"cas_{secrets.token_urlsafe(24)}"
        digest = _digest(token)
        self.store.put_record("token", digest, {"id": digest[:12], "project": project, "description": description,
                                                "created": datetime.now(timezone.utc).isoformat()}, index=("project",))
        return token

    def project_for(self, token: str) -> str | None:
        """The project a token belongs to, or None for an unknown token."""
        now = time.monotonic()
        cached = self._cache.get(token)
        if cached and cached[1] > now:
            return cached[0]
        record = self.store.get_record("token", _digest(token))
        project = str(record["project"]) if record else None
        if len(self._cache) > 10000:
            self._cache.clear()
        self._cache[token] = (project, now + self.cache_seconds)
        return project
