"""Every schema is well-formed, documented, and its examples validate; errors point at fields."""

from __future__ import annotations

from typing import Any

import pytest
from jsonschema import Draft202012Validator

from cascade.core.errors import SchemaViolation, UnknownEventType
from cascade.events import schemas

FAMILIES = ["dataset.uploaded", "dataset.registered", "labels.completed", "job.submitted", "job.started",
            "job.succeeded", "job.failed", "job.cancelled", "finetune.submitted", "model.registered",
            "model.released", "model.deployed", "model.deploy_failed"]
ALL = schemas.event_types() + ["trainingjob.v1", "finetunejob.v1"]


def test_every_event_family_of_the_design_has_a_schema() -> None:
    assert {f"io.cascade.{f}.v1" for f in FAMILIES} <= set(schemas.event_types())


def _properties(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found = []
    if isinstance(node, dict):
        for name, prop in node.get("properties", {}).items():
            found.append((f"{path}/{name}", prop))
            found += _properties(prop, f"{path}/{name}")
        if isinstance(node.get("items"), dict):
            found += _properties(node["items"], f"{path}/items")
    return found


@pytest.mark.parametrize("name", ALL)
def test_schema_is_draft_2020_12_with_id_descriptions_and_valid_examples(name: str) -> None:
    doc = schemas.schema(name)
    Draft202012Validator.check_schema(doc)
    assert doc["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert doc["$id"] == f"{schemas.SCHEMA_BASE}{name}.json"
    assert doc.get("description")
    undocumented = [path for path, prop in _properties(doc) if not prop.get("description")]
    assert undocumented == []
    assert doc["examples"], "at least one example"
    for example in doc["examples"]:
        schemas.validate(name, example)


def test_violation_names_the_field_and_the_schema() -> None:
    with pytest.raises(SchemaViolation) as err:
        schemas.validate("io.cascade.job.submitted.v1",
                         {"jobId": "j", "spec": {"framework": "pytorch", "entrypoint": {"script": "t.py"}, "workers": 0}},
                         prefix="/data")
    assert err.value.field == "/data/spec/workers"
    assert err.value.schema.endswith("io.cascade.job.submitted.v1.json")
    assert isinstance(err.value, ValueError)


@pytest.mark.parametrize("document, pointer", [
    ({"dataset": "d", "uri": "u", "origin": "minio"}, "/size"),
    ({"dataset": "d", "uri": "u", "size": 1, "origin": "minio", "colour": "red"}, "/colour"),
    ({"dataset": "d", "uri": "u", "size": "big", "origin": "minio"}, "/size"),
    ({"dataset": "d", "uri": "u", "size": 1, "origin": "ftp"}, "/origin"),
])
def test_pointer_for_missing_extra_and_wrong_fields(document: dict[str, Any], pointer: str) -> None:
    with pytest.raises(SchemaViolation) as err:
        schemas.validate("io.cascade.dataset.uploaded.v1", document)
    assert err.value.field == pointer


def test_unknown_type_lists_the_known_ones() -> None:
    with pytest.raises(UnknownEventType) as err:
        schemas.validate("io.cascade.nope.v1", {})
    assert "io.cascade.job.failed.v1" in str(err.value)
