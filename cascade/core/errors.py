"""One error tree for the whole platform.

Every failure Cascade raises on purpose is a :class:`CascadeError`, split into
:class:`RetryableError` (try again later: a service is down, a timeout) and
:class:`PermanentError` (retrying cannot help: bad input, unknown names). Callers such as
the gateway and the dispatcher decide between 503-and-retry and 4xx-or-dead-letter on that
split alone, never on message text.
"""

from __future__ import annotations


class CascadeError(Exception):
    """Base of every error Cascade raises on purpose."""

    retryable: bool = False


class RetryableError(CascadeError):
    """A transient failure: the same call may succeed later."""

    retryable = True


class PermanentError(CascadeError):
    """A failure that repeating the same call cannot fix."""


class BusUnavailable(RetryableError):
    """The event bus did not answer or did not confirm a write."""


class StoreUnavailable(RetryableError):
    """The state store did not answer."""


class SourceUnavailable(RetryableError):
    """A connected tool (Label Studio, CVAT) did not answer, or answered with a server error."""


class InvalidInput(PermanentError, ValueError):
    """Input that breaks a contract; ``field`` is a JSON pointer to the failing part."""

    def __init__(self, message: str, *, field: str = "", schema: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.schema = schema

    def to_dict(self) -> dict[str, str]:
        """The error as a JSON-friendly body for an HTTP 4xx or a dead letter."""
        body = {"error": type(self).__name__, "message": self.message}
        if self.field:
            body["field"] = self.field
        if self.schema:
            body["schema"] = self.schema
        return body


class InvalidEvent(InvalidInput):
    """A CloudEvent whose envelope (attributes or encoding) is malformed."""


class SchemaViolation(InvalidEvent):
    """An event's ``data`` (or a job spec) that does not match its JSON Schema."""


class UnknownEventType(InvalidEvent):
    """An event type with no schema in ``schemas/``."""


class Unauthorized(InvalidInput):
    """Missing or wrong credential or signature (HTTP 401)."""


class Forbidden(InvalidInput):
    """A valid credential used beyond what it may do: another project, a missing scope (HTTP 403)."""


class TooLarge(InvalidInput):
    """A body over the configured limit (HTTP 413), detected from the header or while streaming."""


class NotFound(PermanentError, KeyError):
    """A named thing (job, model, topic, trigger) does not exist."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "not found"
