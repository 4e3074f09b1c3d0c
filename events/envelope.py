"""Make and check Cascade's CloudEvents (1.0) so every plane speaks one contract.

Events are the SDK's ``cloudevents.http.CloudEvent``. :func:`new_event` fills the envelope
(id, time, dataschema, content type) and validates it; :func:`check_event` is what the
gateway and the dispatcher run on events from outside. Follow-up events made with
:func:`follow_up` carry the first hop's ``traceparent``/``tracestate`` and ``project``.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from cloudevents.http import CloudEvent

from cascade.core.errors import InvalidEvent
from cascade.events import schemas

REQUIRED = ("id", "source", "specversion", "type")
OPTIONAL = ("datacontenttype", "dataschema", "subject", "time")
PROPAGATED = ("traceparent", "tracestate", "project")
_EXTENSION = re.compile(r"^[a-z0-9]{1,20}$")
_RFC3339 = re.compile(
    r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$"
)
JSON = "application/json"


def event_type(family: str) -> str:
    """``dataset.uploaded`` -> ``io.cascade.dataset.uploaded.v1``."""
    return f"{schemas.TYPE_PREFIX}{family}.v1"


def now_rfc3339() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def new_event(
    type: str,
    data: Mapping[str, Any],
    *,
    source: str,
    id: str | None = None,
    subject: str | None = None,
    partitionkey: str | None = None,
    extensions: Mapping[str, str] | None = None,
) -> CloudEvent:
    """A validated event of a known type; ``type`` may be a family (``job.failed``)."""
    if not type.startswith(schemas.TYPE_PREFIX):
        type = event_type(type)
    attributes: dict[str, Any] = {
        "id": id or str(uuid.uuid4()),
        "source": source,
        "specversion": "1.0",
        "type": type,
        "time": now_rfc3339(),
        "datacontenttype": JSON,
        "dataschema": schemas.schema_uri(type),
    }
    if subject:
        attributes["subject"] = subject
    if partitionkey:
        attributes["partitionkey"] = partitionkey
    attributes.update(extensions or {})
    event = CloudEvent(attributes, dict(data))
    check_event(event)
    return event


def follow_up(
    cause: CloudEvent, type: str, data: Mapping[str, Any], *, source: str, **kwargs: Any
) -> CloudEvent:
    """A new event caused by ``cause``: tracing context and project travel along."""
    ext = {k: str(cause[k]) for k in PROPAGATED if cause.get(k)}
    ext.update(kwargs.pop("extensions", None) or {})
    return new_event(type, data, source=source, extensions=ext, **kwargs)


def canonical(value: Any) -> str:
    """An attribute value's canonical string form (CloudEvents type system): ``true``/``false``, ``42``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def canonicalize(attributes: dict[str, Any]) -> None:
    """Turn extension values of the other CloudEvents types (Boolean, Integer) into their canonical strings.

    Every transport carries them as strings anyway (binary HTTP and Kafka headers); doing it once at
    the edge means every part of Cascade sees one form. InvalidEvent for a value no CloudEvents type has.
    """
    for name, value in list(attributes.items()):
        if name in REQUIRED or name in OPTIONAL or name == "data" or isinstance(value, str):
            continue
        if isinstance(value, bool) or (isinstance(value, int) and -(2**31) <= value < 2**31):
            attributes[name] = canonical(value)
        else:
            raise InvalidEvent(f"extension {name!r} must be a string, boolean or 32-bit integer, "
                               f"not {type(value).__name__}", field=f"/{name}")


def media_type(content_type: str) -> str:
    """``application/json; charset=utf-8`` -> ``application/json``."""
    return content_type.split(";", 1)[0].strip().lower()


def check_attributes(attributes: Mapping[str, Any]) -> None:
    """Raise InvalidEvent (field = JSON pointer of the attribute) for a malformed envelope."""
    for name in REQUIRED:
        value = attributes.get(name)
        if not isinstance(value, str) or not value:
            raise InvalidEvent(f"attribute {name!r} is required and must be a non-empty string", field=f"/{name}")
    if attributes["specversion"] != "1.0":
        raise InvalidEvent("only CloudEvents specversion 1.0 is supported", field="/specversion")
    time = attributes.get("time")
    if time is not None and not (isinstance(time, str) and _RFC3339.match(time)):
        raise InvalidEvent(f"time {time!r} is not an RFC 3339 timestamp", field="/time")
    for name, value in attributes.items():
        if name in REQUIRED or name in OPTIONAL or name == "data":
            continue
        if not _EXTENSION.match(name):
            raise InvalidEvent(
                f"extension name {name!r} must be 1-20 lowercase letters or digits", field=f"/{name}"
            )
        if value is None:
            raise InvalidEvent(f"extension {name!r} has no value", field=f"/{name}")


def check_event(event: CloudEvent) -> None:
    """Check the envelope and validate ``data`` against the schema its type names."""
    attributes = event.get_attributes()
    check_attributes(attributes)
    ctype = media_type(str(attributes.get("datacontenttype") or JSON))
    if ctype != JSON and not ctype.endswith("+json"):
        raise InvalidEvent(f"datacontenttype {ctype!r} is not JSON; Cascade events carry JSON data", field="/datacontenttype")
    schemas.validate(attributes["type"], event.get_data(), prefix="/data")
