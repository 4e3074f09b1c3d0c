"""The CloudEvents envelope rules and the Kafka / HTTP bindings."""

from __future__ import annotations

import json

import pytest
from cloudevents import kafka as sdk_kafka
from cloudevents.http import CloudEvent

from cascade.core.errors import InvalidEvent, SchemaViolation
from cascade.events.bindings import http
from cascade.events.bindings.kafka import STRUCTURED, WireRecord, from_wire, to_wire
from cascade.events.envelope import check_attributes, check_event, follow_up, new_event

DATA = {"dataset": "cats", "uri": "s3://images/cats/1.jpg", "size": 10, "origin": "aws-s3"}


def uploaded(**kwargs: object) -> CloudEvent:
    return new_event("dataset.uploaded", DATA, source="/tests", **kwargs)  # type: ignore[arg-type]


def test_new_event_fills_the_envelope() -> None:
    event = uploaded(partitionkey="cats")
    attrs = event.get_attributes()
    assert attrs["specversion"] == "1.0"
    assert attrs["type"] == "io.cascade.dataset.uploaded.v1"
    assert attrs["dataschema"].endswith("/io.cascade.dataset.uploaded.v1.json")
    assert attrs["datacontenttype"] == "application/json"
    assert attrs["time"].endswith("Z") and attrs["id"]


def test_new_event_rejects_bad_data_with_a_pointer() -> None:
    with pytest.raises(SchemaViolation) as err:
        new_event("dataset.uploaded", {**DATA, "size": -1}, source="/tests")
    assert err.value.field == "/data/size"


@pytest.mark.parametrize("attrs, field", [
    ({"id": ""}, "/id"),
    ({"source": None}, "/source"),
    ({"specversion": "0.3"}, "/specversion"),
    ({"time": "yesterday"}, "/time"),
    ({"Bad_Name": "x"}, "/Bad_Name"),
    ({"averyveryverylongextensionname": "x"}, "/averyveryverylongextensionname"),
])
def test_malformed_envelopes_are_rejected(attrs: dict[str, object], field: str) -> None:
    base = {**uploaded().get_attributes(), **attrs}
    with pytest.raises(InvalidEvent) as err:
        check_attributes(base)
    assert err.value.field == field


def test_non_json_data_is_rejected() -> None:
    event = CloudEvent({**uploaded().get_attributes(), "datacontenttype": "text/plain"}, "hi")
    with pytest.raises(InvalidEvent) as err:
        check_event(event)
    assert err.value.field == "/datacontenttype"


def test_follow_up_carries_trace_context_and_project() -> None:
    cause = uploaded(extensions={"traceparent": "00-aa-bb-01", "tracestate": "k=v", "project": "vision"})
    effect = follow_up(cause, "job.cancelled", {"jobId": "j"}, source="/functions/x")
    assert (effect["traceparent"], effect["tracestate"], effect["project"]) == ("00-aa-bb-01", "k=v", "vision")


def test_kafka_binary_mode_round_trip_with_partitionkey_as_record_key() -> None:
    event = uploaded(partitionkey="cats")
    wire = to_wire(event)
    headers = dict(wire.headers)
    assert wire.key == b"cats"
    assert headers["ce_type"] == b"io.cascade.dataset.uploaded.v1"
    assert headers["content-type"] == b"application/json"
    assert "ce_partitionkey" not in headers
    assert json.loads(wire.value) == DATA
    back = from_wire(wire)
    assert back.get_attributes() == event.get_attributes() and back.get_data() == DATA


@pytest.mark.parametrize("event", [
    uploaded(partitionkey="cats", extensions={"project": "vision", "traceparent": "00-aa-bb-01"}),
    new_event("job.failed", {"jobId": "j", "reason": "ü"}, source="/ä b", subject='50% "done"'),
    CloudEvent({"id": "1", "source": "/s", "type": "t", "specversion": "1.0", "datacontenttype": "application/json"},
               {"a": [1, None]}),
])
def test_kafka_binary_records_decode_as_the_sdk_decodes_them(event: CloudEvent) -> None:
    """Binary records are decoded by Cascade's own one-pass reader: what the SDK writes, it reads as the SDK does."""
    message = sdk_kafka.to_binary(event, key_mapper=lambda e: e.get("partitionkey"))
    wire = WireRecord(message.key if not isinstance(message.key, str) else message.key.encode(),
                      tuple(message.headers.items()), message.value)
    ours, theirs = from_wire(wire), sdk_kafka.from_binary(message, data_unmarshaller=json.loads)
    if isinstance(theirs.get("partitionkey"), bytes):
        theirs["partitionkey"] = theirs["partitionkey"].decode()
    assert ours.get_attributes() == theirs.get_attributes() == event.get_attributes()
    assert ours.get_data() == theirs.get_data() == event.get_data()


def test_a_kafka_record_without_ce_specversion_is_not_an_event() -> None:
    wire = to_wire(uploaded())
    with pytest.raises(InvalidEvent, match="neither binary"):
        from_wire(WireRecord(None, tuple(h for h in wire.headers if h[0] != "ce_specversion"), wire.value))
    with pytest.raises(InvalidEvent, match="cannot decode"):
        from_wire(WireRecord(None, wire.headers, b"{not json"))


def test_kafka_structured_mode_is_accepted_on_read() -> None:
    event = uploaded(partitionkey="cats")
    wire = to_wire(event, structured=True)
    assert wire.header("content-type") == STRUCTURED.encode()
    back = from_wire(wire)
    assert back.get_attributes() == event.get_attributes() and back.get_data() == DATA
    keyed = from_wire(WireRecord(b"other", wire.headers, json.dumps({**json.loads(wire.value), "partitionkey": None}).encode().replace(b',"partitionkey":null', b"")))
    assert keyed["partitionkey"] == "other", "the record key fills a missing partitionkey"


def test_kafka_record_that_is_not_an_event() -> None:
    with pytest.raises(InvalidEvent):
        from_wire(WireRecord(None, (), b"hello"))
    with pytest.raises(InvalidEvent):
        from_wire(WireRecord(None, (("content-type", STRUCTURED.encode()),), b"{not json"))


def test_http_binary_structured_and_batch_round_trip() -> None:
    event = uploaded(partitionkey="cats")
    for encode in (http.to_binary, http.to_structured):
        headers, body = encode(event)
        [back] = http.parse(headers, body)
        assert back.get_attributes() == event.get_attributes() and back.get_data() == DATA
    headers, body = http.to_batch([event, uploaded()])
    assert [e.get_data() for e in http.parse(headers, body)] == [DATA, DATA]


def test_http_rejects_unknown_media_types_and_malformed_bodies() -> None:
    with pytest.raises(http.UnsupportedMediaType):
        http.parse({"content-type": "text/plain"}, b"hi")
    with pytest.raises(http.UnsupportedMediaType):
        http.parse({"content-type": "application/xml", "ce-specversion": "1.0"}, b"<a/>")
    with pytest.raises(InvalidEvent):
        http.parse({"content-type": http.STRUCTURED}, b"[1, 2]")
    with pytest.raises(InvalidEvent):
        http.parse({"content-type": http.BATCH}, b'{"not": "a list"}')
    with pytest.raises(InvalidEvent):
        http.parse({"content-type": http.STRUCTURED}, b'{"specversion": "1.0"}')


def test_http_binary_headers_are_percent_encoded_both_ways() -> None:
    event = new_event("job.failed", {"jobId": "j", "reason": "ü"}, source="/a b", subject='50% "done"')
    headers, body = http.to_binary(event)
    assert headers["ce-source"] == "/a%20b" and "%25" in headers["ce-subject"]
    [back] = http.parse(headers, body)
    assert (back["source"], back["subject"]) == ("/a b", '50% "done"')


def test_http_binary_mode_requires_id_source_and_type() -> None:
    headers, body = http.to_binary(uploaded())
    del headers["ce-id"]
    with pytest.raises(InvalidEvent) as err:
        http.parse(headers, body)
    assert err.value.field == "/id"
