"""The platform credential: how the platform's own parts prove themselves to each other.

Project tokens stop at their project; the platform's internal calls (the dispatcher invoking
functions, deploy-model loading a model into the runtime, the CLI reading the runtime's
admin API, platform functions publishing job and model events) need more. ``cascade up``
creates one random credential, once, in ``CASCADE_HOME/platform.token`` (mode 0600, never
printed); every part on the machine reads it from there, a pod from ``CASCADE_PLATFORM_TOKEN``
(a Secret reference). A caller holding it is the platform; nobody else is.

A job's report credential (``job_credential``) is derived from it for one job: the
metrics-reporter beside a trial's pods holds it (from a Secret of the job's namespace) and may
post that job's intermediate metrics, and nothing else. Nothing stores it; the gateway derives
it again to check it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
from collections.abc import Mapping
from pathlib import Path

ENV = "CASCADE_PLATFORM_TOKEN"
FILE = "platform.token"


def platform_token(home: Path, *, create: bool = False) -> str:
    """The credential from the environment or ``home/platform.token``; made there when ``create``.

    Returns "" when there is none (a component started without a platform).
    """
    if os.environ.get(ENV):
        return os.environ[ENV]
    path = home / FILE
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        if not create:
            return ""
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    token = f"casp_{secrets.token_urlsafe(32)}"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token


def bearer(headers: Mapping[str, str]) -> str:
    """The token of an ``Authorization: Bearer <token>`` header ("" when there is none)."""
    scheme, _, token = headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() in ("bearer", "token") else ""


def matches(presented: str, expected: str) -> bool:
    """Constant-time comparison; an empty credential never matches."""
    return bool(presented and expected) and hmac.compare_digest(presented.encode(), expected.encode())


def auth_header(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"} if token else {}


def job_credential(platform: str, job_id: str) -> str:
    """The credential that reports ``job_id``'s metrics: an HMAC of the job id under the platform credential."""
    digest = hmac.new(platform.encode(), f"cascade-job-report\x00{job_id}".encode(), hashlib.sha256).digest()
    return "casj_" + base64.urlsafe_b64encode(digest).decode().rstrip("=")


def reports_for(presented: str, platform: str, job_id: str) -> bool:
    """Whether ``presented`` is ``job_id``'s report credential (never without a platform credential)."""
    return bool(platform) and matches(presented, job_credential(platform, job_id))
