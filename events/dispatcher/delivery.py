"""Deliver one event to one subscriber over HTTP, retrying as the trigger's delivery spec says.

Retried: connection errors, timeouts, and HTTP 404, 408, 409, 429 and 5xx (as Knative's
dispatcher does). Any other non-2xx fails at once. A 503 that Cascade's own runtime marks
``x-cascade-error: infrastructure`` (its state store is away, or another live instance holds
the event) is retried without spending the trigger's retries, at most every
``INFRASTRUCTURE_BACKOFF`` seconds: an outage that heals never turns into a dead letter. A 2xx response that carries CloudEvents
(binary, structured or batch) is the subscriber's reply; each must be a valid Cascade event.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass

from cloudevents.http import CloudEvent

from cascade.core.errors import InvalidInput
from cascade.events.bindings import http as ce_http
from cascade.events.dispatcher.http import DeliveryError, DeliveryTimeout, Response, ThreadLocalHTTP
from cascade.events.envelope import check_event
from cascade.events.triggers import Delivery

RETRYABLE = {404, 408, 409, 429}
ERROR_DATA_LIMIT = 1024
INFRASTRUCTURE_BACKOFF = 5.0

log = logging.getLogger("cascade.dispatcher")


@dataclass(frozen=True)
class Outcome:
    ok: bool
    attempts: int
    code: int | None = None  # last HTTP status; None when no response came back
    error: str = ""  # truncated response body or the reason no response came
    replies: tuple[CloudEvent, ...] = ()
    aborted: bool = False  # the dispatcher is stopping: neither delivered nor failed


def _replies(response: Response) -> tuple[CloudEvent, ...]:
    """The reply: one event (binary or structured mode) or several (batch mode)."""
    ctype = response.headers.get("content-type", "")
    if "ce-specversion" not in response.headers and not ctype.startswith("application/cloudevents"):
        return ()
    events = ce_http.parse(response.headers, response.body)
    for event in events:
        check_event(event)
    return tuple(events)


def deliver(client: ThreadLocalHTTP, url: str, event: CloudEvent, spec: Delivery, stop: threading.Event,
            auth: Mapping[str, str] | None = None) -> Outcome:
    """POST ``event`` to ``url`` in binary mode until it succeeds, fails for good, or retries run out.

    ``auth``: headers that prove the platform (sent to the platform's own functions only)."""
    headers, body = ce_http.to_binary(event)
    headers.update(auth or {})
    code: int | None = None
    error = ""
    attempt = waits = 0
    while True:
        infrastructure = False
        try:
            response = client.post(url, headers, body, spec.timeout_seconds)
            code = response.status
            if 200 <= code < 300:
                try:
                    return Outcome(True, attempt + 1, code, replies=_replies(response))
                except InvalidInput as exc:
                    return Outcome(False, attempt + 1, code, f"invalid reply: {exc}"[:ERROR_DATA_LIMIT])
            error = response.text[:ERROR_DATA_LIMIT]
            retryable = code in RETRYABLE or code >= 500
            infrastructure = code == 503 and response.headers.get("x-cascade-error") == "infrastructure"
        except DeliveryTimeout:
            code, error, retryable = None, f"timed out after {spec.timeout}", True
        except DeliveryError as exc:
            code, error, retryable = None, str(exc)[:ERROR_DATA_LIMIT], True
        if infrastructure:
            delay = min(spec.delay(waits), INFRASTRUCTURE_BACKOFF)
            waits += 1
            log.warning("delivery of %s to %s waits for the platform (%s); retrying in %.1fs", event["id"], url,
                        error[:200], delay)
        else:
            if not retryable or attempt == spec.retry:
                return Outcome(False, attempt + 1, code, error)
            delay = spec.delay(attempt)
            log.warning("delivery of %s to %s failed (attempt %d of %d: %s %s); retrying in %.1fs", event["id"], url,
                        attempt + 1, spec.retry + 1, code or "-", error[:200], delay)
            attempt += 1
        if stop.wait(delay):
            return Outcome(False, attempt + 1, code, error, aborted=True)
