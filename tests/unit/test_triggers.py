"""Trigger declarations: filter dialects, data expressions, durations, delivery arithmetic, loading."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cascade.core.errors import InvalidInput
from cascade.events.durations import seconds
from cascade.events.expressions import Expression
from cascade.events.triggers import Delivery, Trigger, load_triggers

ATTRS = {"type": "io.cascade.dataset.uploaded.v1", "source": "/gw/s3/cats", "subject": "train/a.jpg", "project": "p"}
DATA = {"size": 2048, "origin": "minio", "tags": ["a", "b"], "meta": {"split": "train"}}


@pytest.mark.parametrize("filters, expected", [
    ([], True),
    ([{"exact": {"type": "io.cascade.dataset.uploaded.v1"}}], True),
    ([{"exact": {"type": "io.cascade.dataset.uploaded"}}], False),
    ([{"exact": {"Type": "io.cascade.dataset.uploaded.v1"}}], False),  # case-sensitive names
    ([{"exact": {"missing": ""}}], False),
    ([{"prefix": {"subject": "train/"}}, {"suffix": {"subject": ".jpg"}}], True),
    ([{"prefix": {"subject": "train/"}}, {"suffix": {"subject": ".png"}}], False),  # ANDed list
    ([{"prefix": {"subject": "train/", "source": "/gw/"}}], True),
    ([{"any": [{"exact": {"project": "q"}}, {"exact": {"project": "p"}}]}], True),
    ([{"all": [{"exact": {"project": "p"}}, {"not": {"suffix": {"subject": ".jpg"}}}]}], False),
    ([{"not": {"exact": {"project": "q"}}}], True),
    ([{"data": "data.size > 1024 and data.origin == 'minio'"}], True),
    ([{"data": "data.meta.split == 'train' and 'b' in data.tags and len(data.tags) == 2"}], True),
    ([{"data": "data['meta']['split'] != 'train' or data.nothing.deeper > 1"}], False),
    ([{"data": "startswith(data.origin, 'mi') and not endswith(lower(data.origin), 'x')"}], True),
    ([{"data": "data.size > 'text'"}], False),  # a type error is no match, not a crash
])
def test_filter_dialects(filters: list[dict[str, Any]], expected: bool) -> None:
    t = Trigger.model_validate({"name": "t", "subscriber": "f", "filters": filters})
    assert t.matches(ATTRS, DATA) is expected


@pytest.mark.parametrize("text", ["__import__('os')", "data.size.__class__", "open('x')", "lambda: 1", "data.x = 1",
                                  "[x for x in data]", "data.size +", "os.system('x')"])
def test_unsafe_or_broken_expressions_are_refused(text: str) -> None:
    with pytest.raises(InvalidInput):
        Expression.compile(text)


@pytest.mark.parametrize("bad", [[{"exact": "x"}], [{"exact": {"a": "b"}, "prefix": {"a": "b"}}], [{"regex": {}}],
                                 [{"all": {"exact": {}}}], [{"data": 5}]])
def test_malformed_filters_are_refused(bad: list[Any]) -> None:
    with pytest.raises(ValueError, match="filters"):
        Trigger.model_validate({"name": "t", "subscriber": "f", "filters": bad})


def test_durations() -> None:
    assert seconds("PT0.2S") == pytest.approx(0.2)
    assert seconds("PT1M30S") == 90 and seconds("PT2H") == 7200 and seconds("P1D") == 86400
    for bad in ("0.2", "PT", "P", "1S", "PT-1S", "PTS"):
        with pytest.raises(InvalidInput):
            seconds(bad)


def test_delivery_defaults_are_knatives_and_backoff_grows_as_documented() -> None:
    d = Delivery()
    assert (d.retry, d.backoff_policy, d.backoff_delay) == (10, "exponential", "PT0.2S")
    assert [d.delay(n) for n in range(4)] == pytest.approx([0.2, 0.4, 0.8, 1.6])
    linear = Delivery.model_validate({"backoffPolicy": "linear", "backoffDelay": "PT0.5S", "retry": 3, "timeout": "PT1S"})
    assert [linear.delay(n) for n in range(3)] == pytest.approx([0.5, 1.0, 1.5])
    assert linear.worst_case_seconds() == pytest.approx(4 * 1 + 3.0)
    with pytest.raises(ValueError):
        Delivery.model_validate({"backoffDelay": "200ms"})


def test_loading_from_func_yaml_and_trigger_files(tmp_path: Path) -> None:
    (tmp_path / "catalog").mkdir()
    (tmp_path / "catalog" / "func.yaml").write_text(
        "name: catalog-dataset\ntriggers:\n- name: on-upload\n  filters:\n  - exact: {type: io.cascade.dataset.uploaded.v1}\n")
    (tmp_path / "extra.triggers.yaml").write_text(
        "triggers:\n- name: to-webhook\n  subscriber: https://example.invalid/hook\n  ordering: ordered\n"
        "  delivery: {retry: 2, backoffPolicy: linear, deadLetterSink: my-dlq}\n")
    triggers = {t.name: t for t in load_triggers([tmp_path])}
    assert triggers["on-upload"].subscriber == "catalog-dataset" and not triggers["on-upload"].is_url
    hook = triggers["to-webhook"]
    assert hook.is_url and hook.ordering == "ordered" and hook.dead_letter_topic == "my-dlq"
    assert hook.group("cascade.events") == "cascade.events.trigger.to-webhook"
    assert hook.retry_topic("cascade.events") == "cascade.events.retry.to-webhook"


def test_loading_errors_name_the_file_and_field(tmp_path: Path) -> None:
    (tmp_path / "bad.triggers.yaml").write_text("triggers:\n- name: x\n  subscriber: f\n  ordering: sorted\n")
    with pytest.raises(InvalidInput) as err:
        load_triggers([tmp_path])
    assert "bad.triggers.yaml" in str(err.value) and "ordering" in str(err.value)
    (tmp_path / "bad.triggers.yaml").write_text("triggers:\n- name: x\n  subscriber: f\n- name: x\n  subscriber: g\n")
    with pytest.raises(InvalidInput, match="declared twice"):
        load_triggers([tmp_path])
