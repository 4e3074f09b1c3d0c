"""A labelling tool's REST API as Cascade calls it: one error mapping for Label Studio and CVAT.

The URL and credential come from a project's user, so the answers are never echoed: a
refusal names the status and the field to fix, an outage is retryable, and nothing from
the tool's body reaches an error message (the gateway must not become a way to read
other hosts' pages). Redirects are not followed, for the same reason.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import httpx

from cascade.core.errors import InvalidInput, NotFound, SourceUnavailable


def check_url(url: str) -> str:
    """``url`` without a trailing slash, if it is an http(s) URL with a host."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.username or parts.password:
        raise InvalidInput("url must be an http:// or https:// URL of the tool, without credentials in it", field="/url")
    return url.rstrip("/")


class ToolAPI:
    """An HTTP client of one tool install; ``name`` appears in messages, ``credential`` names the field a
    refused credential came from, ``webhooks`` is where the tool keeps its webhooks."""

    name = "the tool"
    credential = "/credential"
    webhooks = "/api/webhooks"

    def __init__(self, url: str, headers: dict[str, str], *, timeout: float = 10.0,
                 auth: httpx.Auth | None = None) -> None:
        self.url = check_url(url)
        self.client = httpx.Client(base_url=self.url, headers=headers, auth=auth, timeout=timeout,
                                   follow_redirects=False)

    def call(self, method: str, path: str, *, what: str, **kwargs: Any) -> Any:
        """The JSON answer; refusals as InvalidInput/NotFound, outages as SourceUnavailable."""
        try:
            reply = self.client.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise SourceUnavailable(f"{self.name} at {self.url} did not answer ({type(exc).__name__})") from None
        status = reply.status_code
        if status in (401, 403):
            raise InvalidInput(f"{self.name} refused the credential ({status}) for {what}", field=self.credential)
        if status == 404:
            raise NotFound(f"{self.name} at {self.url} has no {what} (404)")
        if status >= 500 or status == 429:
            raise SourceUnavailable(f"{self.name} at {self.url} answered {status} for {what}")
        if status >= 300:
            raise InvalidInput(f"{self.name} at {self.url} refused {what} ({status})", field="/url")
        if status == 204 or not reply.content:
            return None
        try:
            return reply.json()
        except ValueError:
            raise SourceUnavailable(f"{self.name} at {self.url} answered {what} with something that is not JSON") from None

    def object(self, method: str, path: str, what: str, **kwargs: Any) -> dict[str, Any]:
        """A call whose answer must be a JSON object."""
        found = self.call(method, path, what=what, **kwargs)
        if not isinstance(found, dict):
            raise SourceUnavailable(f"{self.name} answered {what} with something that is not an object")
        return found

    def add_webhook(self, body: dict[str, Any]) -> int:
        """Register a webhook; its id in the tool."""
        hook = self.object("POST", self.webhooks, "a new webhook", json=body)
        if not isinstance(hook.get("id"), int):
            raise SourceUnavailable(f"{self.name} answered the new webhook without an id")
        return int(hook["id"])

    def delete_webhook(self, hook_id: int) -> None:
        slash = "/" if self.webhooks.endswith("/") else ""
        self.call("DELETE", f"{self.webhooks.rstrip('/')}/{hook_id}{slash}", what=f"webhook {hook_id}")

    def close(self) -> None:
        self.client.close()
