"""Property-based run of the gateway's OpenAPI (schemathesis) on the real Kafka bus: no 5xx."""

from __future__ import annotations

import tempfile
from pathlib import Path

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from cascade.core.settings import GatewaySettings
from cascade.events.bus.kafka import KafkaBus
from cascade.events.gateway import create_app
from cascade.events.identity import Projects
from cascade.stores.sqlite import SqliteStore
from tests.conftest import KAFKA

_home = Path(tempfile.mkdtemp(prefix="cascade-fuzz-"))
_store = SqliteStore(_home / "state.db")
Projects(_store).create_project("fuzz")
TOKEN = Projects(_store).create_token("fuzz")
app = create_app(KafkaBus(KAFKA, request_timeout=5.0), _store, GatewaySettings(cvat_secret="s", burst=100000),
                 "cascade.fuzz", hosts=["testserver"])
schema = schemathesis.openapi.from_asgi("/openapi.json", app)


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_input_makes_the_gateway_fail(case: schemathesis.Case) -> None:
    for headers in ({"authorization": f"Bearer {TOKEN}"}, {}):
        case.call_and_validate(headers=headers, checks=[not_a_server_error])
