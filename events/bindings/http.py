"""CloudEvents <-> HTTP: binary (``ce-`` headers), structured and batch modes.

Used by the gateway to read requests and by the dispatcher to deliver events and read
replies. Errors are typed: :class:`UnsupportedMediaType` (HTTP 415) for content types no
mode accepts, :class:`~cascade.core.errors.InvalidEvent` (HTTP 400) for malformed events.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote, unquote

from cloudevents import exceptions as ce_errors
from cloudevents.conversion import to_dict
from cloudevents.http import CloudEvent, from_dict

from cascade.core.errors import InvalidEvent, InvalidInput
from cascade.core.jsonlimits import loads
from cascade.events.envelope import canonical, canonicalize, media_type

STRUCTURED = "application/cloudevents+json"
_NAME = re.compile(r"^[a-z0-9]+$")  # CloudEvents attribute names
BATCH = "application/cloudevents-batch+json"


class UnsupportedMediaType(InvalidInput):
    """A request whose content type is not a CloudEvents HTTP mode Cascade accepts."""


def _raw_content_type(headers: Mapping[str, str]) -> str:
    value = headers.get("content-type")  # a case-insensitive mapping (the servers' and clients') answers at once
    if value is None:
        value = next((v for key, v in headers.items() if key.lower() == "content-type"), "")
    return value.strip()


def _content_type(headers: Mapping[str, str]) -> str:
    return media_type(_raw_content_type(headers))


def _one(attributes: Any) -> CloudEvent:
    if not isinstance(attributes, dict):
        raise InvalidEvent("a structured CloudEvent must be a JSON object")
    for name in attributes:
        if name not in ("data", "data_base64") and not _NAME.match(name):
            raise InvalidEvent(f"attribute name {name!r} must be lower-case letters and digits", field=f"/{name}")
    for name in ("id", "source", "type", "specversion"):
        if not isinstance(attributes.get(name), str) or not attributes[name]:
            raise InvalidEvent(f"attribute {name!r} is required and must be a non-empty string", field=f"/{name}")
    attributes = dict(attributes)
    canonicalize(attributes)
    try:
        return from_dict(attributes)
    except (ce_errors.GenericException, ValueError, TypeError, KeyError) as exc:
        raise InvalidEvent(f"not a valid CloudEvent: {exc}") from exc


def _binary(headers: Mapping[str, str], body: bytes, ctype: str) -> CloudEvent:
    """Binary mode: attributes from ``ce-`` headers (percent-decoded), JSON data in the body."""
    attributes: dict[str, Any] = {}
    for key, value in headers.items():
        if key[:3].lower() == "ce-":
            attributes[key[3:].lower()] = unquote(value) if "%" in value else value
    if ctype:
        attributes["datacontenttype"] = _raw_content_type(headers)  # parameters (charset) kept
    try:
        data = loads(body, "/data") if body else None
    except InvalidInput as exc:
        raise InvalidEvent(exc.message, field="/data") from exc
    for name in ("id", "source", "type", "specversion"):
        if not attributes.get(name):
            raise InvalidEvent(f"header ce-{name} is required", field=f"/{name}")
    try:
        return CloudEvent(attributes, data)
    except ce_errors.GenericException as exc:
        raise InvalidEvent(str(exc)) from exc


def parse(headers: Mapping[str, str], body: bytes) -> list[CloudEvent]:
    """Events in an HTTP request: one for binary/structured, a list for batch mode."""
    ctype = _content_type(headers)
    if ctype.startswith("application/cloudevents-batch"):
        try:
            items = loads(body, what="batch body")
        except InvalidInput as exc:
            raise InvalidEvent(exc.message) from exc
        if not isinstance(items, list):
            raise InvalidEvent("a CloudEvents batch must be a JSON array")
        return [_one(item) for item in items]
    if ctype == STRUCTURED:
        try:
            document = loads(body, what="structured body")
        except InvalidInput as exc:
            raise InvalidEvent(exc.message) from exc
        return [_one(document)]
    if headers.get("ce-specversion") is not None or any(k.lower() == "ce-specversion" for k in headers):
        if ctype and ctype != "application/json" and not ctype.endswith("+json"):
            raise UnsupportedMediaType(f"content type {ctype!r} is not JSON", field="content-type")
        return [_binary(headers, body, ctype)]
    raise UnsupportedMediaType(
        f"content type {ctype or '(none)'!r} is not a CloudEvents mode: send ce- headers with "
        f"application/json, or {STRUCTURED}, or {BATCH}",
        field="content-type",
    )


_HEADER_SAFE = "!#$&'()*+,/:;=?@[]^_`{|}~-."
_NEEDS_NO_QUOTING = re.compile(r"[A-Za-z0-9" + re.escape(_HEADER_SAFE) + "]*")


def _header(value: str) -> str:
    """A percent-encoded header value (most are left alone by it: checked first, that costs a tenth of quoting)."""
    return value if _NEEDS_NO_QUOTING.fullmatch(value) else quote(value, safe=_HEADER_SAFE)


def to_binary(event: CloudEvent) -> tuple[dict[str, str], bytes]:
    """Headers and body for binary mode (what the dispatcher sends subscribers)."""
    headers = {f"ce-{k}": _header(canonical(v))
               for k, v in event.get_attributes().items() if k != "datacontenttype" and v is not None}
    headers["content-type"] = str(event.get("datacontenttype") or "application/json")
    return headers, json.dumps(event.get_data(), separators=(",", ":")).encode()


def to_structured(event: CloudEvent) -> tuple[dict[str, str], bytes]:
    return {"content-type": STRUCTURED}, json.dumps(to_dict(event), separators=(",", ":")).encode()


def to_batch(events: Sequence[CloudEvent]) -> tuple[dict[str, str], bytes]:
    return {"content-type": BATCH}, json.dumps([to_dict(e) for e in events], separators=(",", ":")).encode()
