"""Validate event ``data`` and job specs against the JSON Schemas in ``schemas/``.

An event type names its schema (``io.cascade.dataset.uploaded.v1`` -> that file), and
``dataschema`` points to the same ``$id``. Errors carry a JSON pointer to the failing field
and the schema's ``$id`` so a client sees exactly what to fix.

Every event the gateway takes and the dispatcher hands on is checked, so the check is on the hot
path: a compiled validator per schema (jsonschema-rs, built once) answers whether a document is
valid, about a microsecond; only a document it refuses goes through the reference implementation
(``jsonschema``), which finds the failing field for the message and has the last word (it does not
check ``uri-reference`` formats, which the compiled one does: such a document is still accepted).
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

import jsonschema
import jsonschema_rs
from jsonschema import Draft202012Validator
from referencing import Registry, Resource

from cascade.core.errors import SchemaViolation, UnknownEventType

SCHEMA_BASE = "https://cascade.dev/schemas/"
TYPE_PREFIX = "io.cascade."


@cache
def _documents() -> dict[str, dict[str, Any]]:
    """Every schema file, by file name (without ``.json``)."""
    docs: dict[str, dict[str, Any]] = {}
    for entry in resources.files("cascade.schemas").iterdir():
        if entry.name.endswith(".json"):
            docs[entry.name[: -len(".json")]] = json.loads(entry.read_text(encoding="utf-8"))
    return docs


@cache
def _registry() -> Registry:
    pairs = [(doc["$id"], Resource.from_contents(doc)) for doc in _documents().values()]
    return Registry().with_resources(pairs)


@cache
def _validator(name: str) -> Draft202012Validator:
    doc = _documents()[name]
    return Draft202012Validator(doc, registry=_registry(), format_checker=Draft202012Validator.FORMAT_CHECKER)


@cache
def _compiled_registry() -> jsonschema_rs.Registry:
    return jsonschema_rs.Registry([(doc["$id"], doc) for doc in _documents().values()])


@cache
def _compiled(name: str) -> jsonschema_rs.Validator:
    return jsonschema_rs.validator_for(_documents()[name], registry=_compiled_registry(), validate_formats=True)


def event_types() -> list[str]:
    """All event types that have a schema."""
    return sorted(n for n in _documents() if n.startswith(TYPE_PREFIX))


def schema(name: str) -> dict[str, Any]:
    """The schema document for an event type or a spec name; raises UnknownEventType."""
    try:
        return _documents()[name]
    except KeyError:
        raise UnknownEventType(
            f"no schema for {name!r}; known types: {', '.join(event_types())}", field="/type"
        ) from None


def schema_uri(name: str) -> str:
    """The ``$id`` of a schema: what an event's ``dataschema`` attribute points to."""
    return str(schema(name)["$id"])


def _pointer(error: jsonschema.ValidationError) -> str:
    parts = [str(p) for p in error.absolute_path]
    instance = error.instance
    if error.validator == "required" and isinstance(instance, dict) and isinstance(error.validator_value, list):
        missing = [r for r in error.validator_value if r not in instance]
        parts += missing[:1]
    elif error.validator == "additionalProperties" and isinstance(instance, dict) and isinstance(error.schema, dict):
        known = error.schema.get("properties", {})
        extra = [k for k in instance if k not in known]
        parts += extra[:1]
    return "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in parts)


def validate(name: str, document: Any, *, prefix: str = "") -> None:
    """Check ``document`` against schema ``name``; raise SchemaViolation naming the field.

    ``prefix`` is prepended to the JSON pointer (``/data`` for an event's payload).
    """
    schema(name)  # raises UnknownEventType for a name with no schema
    if _compiled(name).is_valid(document):
        return
    error = jsonschema.exceptions.best_match(_validator(name).iter_errors(document))
    if error is not None:
        pointer = prefix + _pointer(error)
        raise SchemaViolation(
            f"{pointer or '/'}: {error.message}", field=pointer or "/", schema=schema_uri(name)
        )
