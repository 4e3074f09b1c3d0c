"""HTTP statuses for the gateway's errors, decided by error class, never by message text.

Each rejection is a JSON body ``{"error", "message", "field"?, "schema"?}`` so a client can
see which field to fix. Bus outages are 503 with ``Retry-After``: nothing was stored.
"""

from __future__ import annotations

from fastapi.responses import JSONResponse

from cascade.core.errors import (
    CascadeError,
    Forbidden,
    InvalidInput,
    NotFound,
    RetryableError,
    SchemaViolation,
    TooLarge,
    Unauthorized,
    UnknownEventType,
)
from cascade.events.bindings.http import UnsupportedMediaType

__all__ = ["Conflict", "Forbidden", "RangeNotSatisfiable", "RateLimited", "TooLarge", "Unauthorized", "problem",
           "status_of"]


class Conflict(InvalidInput):
    """The request is well formed but the resource cannot answer it as asked (409)."""


class RangeNotSatisfiable(InvalidInput):
    """A byte range past the end of what is served (416)."""


class RateLimited(InvalidInput):
    """A project over its event rate (429); ``retry_after`` in seconds."""

    def __init__(self, message: str, *, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


_STATUS: list[tuple[type[Exception], int]] = [
    (Unauthorized, 401),
    (Forbidden, 403),
    (NotFound, 404),
    (TooLarge, 413),
    (UnsupportedMediaType, 415),
    (SchemaViolation, 422),
    (UnknownEventType, 422),
    (RateLimited, 429),
    (Conflict, 409),
    (RangeNotSatisfiable, 416),
    (InvalidInput, 400),
    (RetryableError, 503),
]


def status_of(exc: CascadeError) -> int:
    """The HTTP status of a Cascade error (500 for one no row names)."""
    return next((code for cls, code in _STATUS if isinstance(exc, cls)), 500)


def problem(exc: CascadeError) -> JSONResponse:
    """The HTTP response for a Cascade error."""
    status = status_of(exc)
    if isinstance(exc, InvalidInput):
        body = exc.to_dict()
    else:
        body = {"error": type(exc).__name__, "message": str(exc)}
    headers = {}
    if isinstance(exc, RateLimited):
        headers["Retry-After"] = str(max(1, round(exc.retry_after)))
    elif isinstance(exc, RetryableError):
        headers["Retry-After"] = "5"
    elif isinstance(exc, Unauthorized):
        headers["WWW-Authenticate"] = "Bearer"
    return JSONResponse(body, status_code=status, headers=headers)
