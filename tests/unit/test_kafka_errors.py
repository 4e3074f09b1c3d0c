"""The Kafka bus raises only the error tree, whatever the client library throws."""

from __future__ import annotations

import asyncio

import pytest

from cascade.core.errors import BusUnavailable
from cascade.events.bindings.kafka import WireRecord
from cascade.events.bus.kafka import KafkaBus


def test_an_admin_connect_after_a_producer_connect_fails_as_bus_unavailable() -> None:
    bus = KafkaBus("127.0.0.1:1", request_timeout=0.2)
    bus._producer = object()  # the producer connected earlier; the admin client did not
    with pytest.raises(BusUnavailable):
        bus._admin_client()


def test_a_publish_nobody_takes_fails_as_bus_unavailable_within_its_timeout() -> None:
    bus = KafkaBus("127.0.0.1:1", request_timeout=0.5)
    bus._topics.add("t")  # no admin round trip: only the producer is asked
    try:
        with pytest.raises(BusUnavailable, match="publish to t"):
            bus.append("t", [WireRecord(b"k", (), b"{}")])
    finally:
        bus.close()  # its delivery thread would go on reporting the refused connects


def test_an_async_publish_whose_report_never_comes_fails_as_bus_unavailable() -> None:
    bus = KafkaBus("127.0.0.1:1", request_timeout=0.1)
    bus._topics.add("t")
    bus._produce = lambda topic, records, settle: None  # type: ignore[method-assign]  # a report that is lost
    with pytest.raises(BusUnavailable, match="no delivery report in time"):
        asyncio.run(asyncio.wait_for(bus.append_async("t", [WireRecord(b"k", (), b"{}")]), 10))


@pytest.mark.parametrize("thrown", [OSError("reset"), ValueError("bad"), AssertionError("state")])
def test_client_exceptions_leave_as_bus_unavailable(thrown: Exception) -> None:
    def call() -> None:
        raise thrown

    with pytest.raises(BusUnavailable):
        KafkaBus("127.0.0.1:1")._guard("publish", call)
