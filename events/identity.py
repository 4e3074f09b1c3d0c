"""Who is calling: project tokens with scopes, and the platform credential.

A project token belongs to one project and carries scopes: ``publish`` (events and
webhooks), ``submit`` (jobs), ``read`` (job records, logs, the dashboard), ``infer`` (the
project's model servers). It is shown once, when created; the store keeps only its SHA-256.
The platform credential (:mod:`cascade.core.credentials`) is the platform itself: every
project, every scope, and the platform's own event types. Every server asks
:meth:`Authenticator.require` the same question. Lookups are cached for ``cache_seconds``, so a
revoked token stops working within that long everywhere.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from cascade.core.credentials import bearer, matches
from cascade.core.errors import Forbidden, InvalidInput, NotFound, Unauthorized
from cascade.events import schemas
from cascade.stores import StateStore

_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")  # a Kubernetes namespace name
SCOPES = ("publish", "submit", "read", "infer")


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class Identity:
    """A caller: a project with scopes, or the platform (``project`` None)."""

    project: str | None
    scopes: frozenset[str]
    token_id: str = ""

    @property
    def platform(self) -> bool:
        return self.project is None

    def may(self, scope: str) -> bool:
        return self.platform or scope in self.scopes

    def sees(self, project: str | None) -> bool:
        return self.platform or project == self.project


PLATFORM = Identity(None, frozenset(SCOPES), "platform")


def check_scopes(scopes: Iterable[str]) -> list[str]:
    chosen = sorted(set(scopes))
    unknown = [s for s in chosen if s not in SCOPES]
    if unknown or not chosen:
        raise InvalidInput(f"scopes must be some of {', '.join(SCOPES)} (got {', '.join(unknown) or 'none'})",
                           field="scopes")
    return chosen


class Projects:
    """Project and token records over a StateStore."""

    def __init__(self, store: StateStore) -> None:
        self.store = store

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

    def set_lint(self, name: str, mode: str) -> dict[str, str]:
        """Whether the resource checklist's findings only warn (``warn``) or refuse the job (``refuse``)."""
        if mode not in ("warn", "refuse"):
            raise InvalidInput("lint is warn or refuse", field="lint")
        record = self.store.get_record("project", name)
        if record is None:
            raise NotFound(f"project {name!r} does not exist; create it with: cascade projects create {name}")
        record["lint"] = mode
        self.store.put_record("project", name, record)
        return record

    def list_projects(self) -> list[dict[str, str]]:
        return self.store.find_records("project")

    def create_token(self, project: str, description: str = "", scopes: Iterable[str] = SCOPES) -> str:
        """A new token for ``project``; the only time the plain token is available."""
        chosen = check_scopes(scopes)
        if not self.store.get_record("project", project):
            raise NotFound(f"project {project!r} does not exist; create it with: cascade projects create {project}")
        token = f"cas_{secrets.token_urlsafe(24)}"
        digest = _digest(token)
        self.store.put_record("token", digest, {"id": digest[:12], "digest": digest, "project": project, "description": description,
                                                "scopes": chosen, "created": datetime.now(timezone.utc).isoformat()},
                              index=("project",))
        return token

    def tokens(self, project: str | None = None) -> list[dict[str, Any]]:
        """Token records (never the tokens), of one project or all."""
        found = self.store.find_records("token", project=project) if project else self.store.find_records("token")
        return [{k: v for k, v in t.items() if k != "digest"} for t in found]

    def revoke(self, token_id: str) -> dict[str, Any]:
        """Delete the token whose id (as ``tokens`` lists it) is ``token_id``."""
        for record in self.store.find_records("token"):
            if record.get("id") == token_id:
                self.store.delete_record("token", str(record["digest"]))
                return {k: v for k, v in record.items() if k != "digest"}
        raise NotFound(f"no token with id {token_id!r}; list them with: cascade tokens ls")

    def lookup(self, token: str) -> Identity | None:
        record = self.store.get_record("token", _digest(token))
        if record is None:
            return None
        return Identity(str(record["project"]), frozenset(record.get("scopes", SCOPES)), str(record.get("id", "")))


class Authenticator:
    """Bearer credential -> Identity, with a short cache; the one check every server makes."""

    def __init__(self, projects: Projects, platform_token: str, *, cache_seconds: float = 5.0) -> None:
        self.projects, self.platform_token, self.cache_seconds = projects, platform_token, cache_seconds
        self._cache: dict[str, tuple[Identity | None, float]] = {}

    def knows(self, headers: Mapping[str, str]) -> bool:
        """Whether ``require`` can answer these headers without asking the store (no credential, the platform's, or
        a token checked in the last ``cache_seconds``): an async server then need not hand the check to a thread."""
        token = bearer(headers)
        if not token or matches(token, self.platform_token):
            return True
        cached = self._cache.get(token)
        return cached is not None and cached[1] > time.monotonic()

    def identify(self, token: str) -> Identity | None:
        if not token:
            return None
        if matches(token, self.platform_token):
            return PLATFORM
        now = time.monotonic()
        cached = self._cache.get(token)
        if cached and cached[1] > now:
            return cached[0]
        identity = self.projects.lookup(token)
        if len(self._cache) > 10000:
            self._cache.clear()
        self._cache[token] = (identity, now + self.cache_seconds)
        return identity

    def require_platform(self, headers: Mapping[str, str]) -> Identity:
        """The platform, or Unauthorized (no credential) / Forbidden (any other); never asks the store."""
        if matches(bearer(headers), self.platform_token):
            return PLATFORM
        if not bearer(headers):
            raise Unauthorized("send 'Authorization: Bearer <platform credential>'", field="authorization")
        raise Forbidden("only the platform credential may do this (a project token reaches functions through "
                        "the gateway and triggers)", field="authorization")

    def require(self, headers: Mapping[str, str], scope: str | None = None) -> Identity:
        """The caller's identity; Unauthorized without a valid credential, Forbidden without ``scope``."""
        token = bearer(headers)
        if not token:
            raise Unauthorized("send 'Authorization: Bearer <token>' (create one with: cascade tokens create PROJECT)",
                               field="authorization")
        identity = self.identify(token)
        if identity is None:
            raise Unauthorized("unknown or revoked token", field="authorization")
        if scope and not identity.may(scope):
            raise Forbidden(f"this token lacks the {scope!r} scope "
                            f"(create one with: cascade tokens create {identity.project} --scope {scope})",
                            field="authorization")
        return identity


PROJECT_TYPES = frozenset(f"io.cascade.{family}.v1" for family in
                          ("dataset.uploaded", "dataset.removed", "labels.progressed", "labels.completed"))
"""What a project token may publish; every other type (jobs, models, edge heartbeats, registered
datasets) is the platform's own, accepted only with the platform credential."""


def may_publish(identity: Identity, event_type: str) -> bool:
    """Whether ``identity`` may publish ``event_type`` (an unknown type is the schema check's to refuse)."""
    if identity.platform or event_type in PROJECT_TYPES:
        return identity.may("publish")
    return event_type not in schemas.event_types()
