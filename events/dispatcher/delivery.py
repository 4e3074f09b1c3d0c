"""Deliver one event to one subscriber over HTTP, retrying as the trigger's delivery spec says.

Retried: connection errors, timeouts, and HTTP 404, 408, 409, 429 and 5xx (as Knative's
dispatcher does). Any other non-2xx fails at once. A 503 that Cascade's own runtime marks
``x-cascade-error: infrastructure`` (its state store is away, or another live instance holds
the event) is retried without spending the trigger's retries, at most every
``INFRASTRUCTURE_BACKOFF`` seconds: an outage that heals never turns into a dead letter. A 2xx response that carries CloudEvents
(binary, structured or batch) is the subscriber's reply; each must be a valid Cascade event.
``Attempts`` is that policy apart from the transport; ``deliver`` runs it on a thread, ``deliver_async`` on
an event loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass

from cloudevents.http import CloudEvent

from cascade.core.errors import InvalidInput
from cascade.events.bindings import http as ce_http
from cascade.events.dispatcher.http import AsyncHTTP, DeliveryError, DeliveryTimeout, Response, ThreadLocalHTTP
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


class Attempts:
    """The retry policy over one event's attempts, apart from any transport: fed each attempt's result, it answers
    the final ``Outcome`` or how many seconds to wait before the next attempt."""

    def __init__(self, event_id: str, url: str, spec: Delivery) -> None:
        self.event_id, self.url, self.spec = event_id, url, spec
        self.attempt = self.waits = 0
        self.code: int | None = None
        self.error = ""

    def answered(self, response: Response) -> Outcome | float:
        code = self.code = response.status
        if 200 <= code < 300:
            try:
                return Outcome(True, self.attempt + 1, code, replies=_replies(response))
            except InvalidInput as exc:
                return Outcome(False, self.attempt + 1, code, f"invalid reply: {exc}"[:ERROR_DATA_LIMIT])
        self.error = response.text[:ERROR_DATA_LIMIT]
        if code == 503 and response.headers.get("x-cascade-error") == "infrastructure":
            delay = min(self.spec.delay(self.waits), INFRASTRUCTURE_BACKOFF)
            self.waits += 1
            log.warning("delivery of %s to %s waits for the platform (%s); retrying in %.1fs", self.event_id,
                        self.url, self.error[:200], delay)
            return delay
        return self._again(code in RETRYABLE or code >= 500)

    def failed(self, exc: DeliveryError | DeliveryTimeout) -> Outcome | float:
        """No response came back (always retryable)."""
        self.code = None
        self.error = (f"timed out after {self.spec.timeout}" if isinstance(exc, DeliveryTimeout)
                      else str(exc)[:ERROR_DATA_LIMIT])
        return self._again(True)

    def _again(self, retryable: bool) -> Outcome | float:
        if not retryable or self.attempt == self.spec.retry:
            return Outcome(False, self.attempt + 1, self.code, self.error)
        delay = self.spec.delay(self.attempt)
        log.warning("delivery of %s to %s failed (attempt %d of %d: %s %s); retrying in %.1fs", self.event_id,
                    self.url, self.attempt + 1, self.spec.retry + 1, self.code or "-", self.error[:200], delay)
        self.attempt += 1
        return delay

    def aborted(self) -> Outcome:
        return Outcome(False, self.attempt + 1, self.code, self.error, aborted=True)


def _request(event: CloudEvent, auth: Mapping[str, str] | None) -> tuple[dict[str, str], bytes]:
    headers, body = ce_http.to_binary(event)
    headers.update(auth or {})
    return headers, body


def deliver(client: ThreadLocalHTTP, url: str, event: CloudEvent, spec: Delivery, stop: threading.Event,
            auth: Mapping[str, str] | None = None) -> Outcome:
    """POST ``event`` to ``url`` in binary mode until it succeeds, fails for good, or retries run out.

    ``auth``: headers that prove the platform (sent to the platform's own functions only)."""
    headers, body = _request(event, auth)
    attempts = Attempts(str(event["id"]), url, spec)
    while True:
        try:
            step = attempts.answered(client.post(url, headers, body, spec.timeout_seconds))
        except (DeliveryTimeout, DeliveryError) as exc:
            step = attempts.failed(exc)
        if isinstance(step, Outcome):
            return step
        if stop.wait(step):
            return attempts.aborted()


async def deliver_async(client: AsyncHTTP, url: str, event: CloudEvent, spec: Delivery, stopping: asyncio.Event,
                        auth: Mapping[str, str] | None = None) -> Outcome:
    """``deliver`` on an event loop: many deliveries in flight on one thread, without a hand-off per event."""
    headers, body = _request(event, auth)
    attempts = Attempts(str(event["id"]), url, spec)
    while True:
        try:
            step = attempts.answered(await client.post(url, headers, body, spec.timeout_seconds))
        except (DeliveryTimeout, DeliveryError) as exc:
            step = attempts.failed(exc)
        if isinstance(step, Outcome):
            return step
        try:
            await asyncio.wait_for(stopping.wait(), step)
            return attempts.aborted()
        except TimeoutError:
            pass
