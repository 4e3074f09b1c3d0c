"""The authenticator answers from memory only what it may: the platform credential, no credential, and a
token it checked within its cache time; anything else is the store's to answer."""

from __future__ import annotations

from pathlib import Path

import pytest

from cascade.core.errors import Unauthorized
from cascade.events.identity import Authenticator, Projects
from cascade.stores.sqlite import SqliteStore


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def test_only_what_was_checked_lately_is_answered_without_the_store(tmp_path: Path) -> None:
    projects = Projects(SqliteStore(tmp_path / "state.db"))
    projects.create_project("team")
    token = projects.create_token("team")
    auth = Authenticator(projects, "platform-secret")
    assert auth.knows({}) and auth.knows(bearer("platform-secret"))
    assert not auth.knows(bearer(token)), "never checked: the store must be asked"
    assert not auth.knows(bearer("cas_unknown"))
    assert auth.require(bearer(token), "publish").project == "team"
    assert auth.knows(bearer(token))
    with pytest.raises(Unauthorized):
        auth.require(bearer("cas_unknown"))
    assert auth.knows(bearer("cas_unknown")), "a refusal is remembered as long as an identity"

    expiring = Authenticator(projects, "platform-secret", cache_seconds=0.0)
    expiring.require(bearer(token))
    assert not expiring.knows(bearer(token)), "past its cache time a token is checked again"
