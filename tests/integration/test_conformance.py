"""Clients not written here: the Python CloudEvents SDK against the gateway, tritonclient against the runtime.

The SDK's default request shapes (structured and binary mode, no ``datacontenttype``), a plain
minimal structured event, batch mode, extension values of every CloudEvents type, and the
REQUIRED attributes, on both buses; then the Open Inference Protocol as tritonclient speaks it
(server live/ready/metadata, model metadata from the artifact, JSON-only and binary infer), the
V1 listing and ``:explain``, and V2-shaped errors.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
from cloudevents.conversion import to_binary, to_structured
from cloudevents.http import CloudEvent
from fastapi.testclient import TestClient

from cascade.core.asgi import ServerThread
from cascade.core.ports import free_port
from cascade.core.settings import GatewaySettings
from cascade.events.bus import EventBus
from cascade.events.gateway import create_app
from cascade.events.identity import Projects
from cascade.serving.runtime.activator import Runtime
from cascade.stores.sqlite import SqliteStore
from tests.conftest import drain, make_bus
from tests.helpers import models

TYPE = "io.cascade.dataset.uploaded.v1"
DATA = {"dataset": "cats", "uri": "s3://cats/1.jpg", "size": 3, "origin": "api"}


class Gateway:
    def __init__(self, bus: EventBus, tmp_path: Path, topic: str) -> None:
        store = SqliteStore(tmp_path / "state.db")
        projects = Projects(store)
        projects.create_project("sdk")
        self.bus, self.topic = bus, topic
        self.auth = {"authorization": f"Bearer {projects.create_token('sdk')}"}
        self.platform = {"authorization": "Bearer casp_conformance"}
        self.client = TestClient(create_app(bus, store, GatewaySettings(), topic, platform_token="casp_conformance"),
                                 base_url="http://localhost")

    def post(self, headers: dict[str, str], body: bytes | str) -> httpx.Response:
        return self.client.post("/events", headers={**headers, **self.auth}, content=body)

    def landed(self, count: int) -> list[CloudEvent]:
        consumer = self.bus.subscribe([self.topic], f"check-{uuid.uuid4().hex[:8]}", start="earliest")
        try:
            return [r.event() for r in drain(consumer, count)]
        finally:
            consumer.close()


@pytest.fixture(params=["embedded", "kafka"])
def gateway(request: pytest.FixtureRequest, tmp_path: Path, topic: str) -> Iterator[Gateway]:
    bus = make_bus(str(request.param), tmp_path)
    bus.ensure_topic(topic)
    yield Gateway(bus, tmp_path, topic)
    bus.close()


def test_the_sdk_default_shapes_and_minimal_events_are_accepted(gateway: Gateway) -> None:
    sdk = CloudEvent({"type": TYPE, "source": "/sdk", "attempt": 3, "urgent": True}, DATA)  # no datacontenttype
    assert "datacontenttype" not in sdk.get_attributes()
    headers, body = to_structured(sdk)
    assert gateway.post(dict(headers), body).status_code == 202
    headers, body = to_binary(CloudEvent({"type": TYPE, "source": "/sdk-binary", "traceparent": "00-" + "1" * 32
                                          + "-" + "2" * 16 + "-01"}, DATA))
    assert gateway.post(dict(headers), body).status_code == 202
    minimal = {"specversion": "1.0", "id": "min-1", "source": "/curl", "type": TYPE, "data": DATA}
    assert gateway.post({"content-type": "application/cloudevents+json"}, json.dumps(minimal)).status_code == 202
    for auth in (gateway.auth, gateway.platform):  # an empty batch is valid and publishes nothing
        empty = gateway.client.post("/events", content="[]",
                                    headers={"content-type": "application/cloudevents-batch+json", **auth})
        assert empty.status_code == 202 and empty.json()["accepted"] == 0, empty.text
    batch = [{**minimal, "id": "batch-1"}, {**minimal, "id": "batch-2"}]
    assert gateway.post({"content-type": "application/cloudevents-batch+json"}, json.dumps(batch)).status_code == 202
    binary_untyped = {"ce-specversion": "1.0", "ce-id": "bin-1", "ce-source": "/curl", "ce-type": TYPE}
    assert gateway.post(binary_untyped, json.dumps(DATA)).status_code == 202, "binary mode without a Content-Type"
    charset = {**binary_untyped, "ce-id": "bin-2", "content-type": "application/json; charset=utf-8"}
    assert gateway.post(charset, json.dumps(DATA)).status_code == 202
    events = {e["id"]: e for e in gateway.landed(7)}
    assert any(e["source"] == "/sdk-binary" for e in events.values())
    structured_sdk = next(e for e in events.values() if e["source"] == "/sdk")
    assert (structured_sdk["attempt"], structured_sdk["urgent"]) == ("3", "true"), "canonical string forms"
    assert events["bin-2"]["datacontenttype"] == "application/json; charset=utf-8"
    assert events["min-1"].get_data() == DATA and events["batch-2"].get_data() == DATA


@pytest.mark.parametrize("drop, field", [("id", "/id"), ("specversion", "/specversion"), ("source", "/source"),
                                         ("type", "/type")])
def test_required_attributes_are_required(gateway: Gateway, drop: str, field: str) -> None:
    event = {"specversion": "1.0", "id": "x", "source": "/curl", "type": TYPE, "data": DATA}
    del event[drop]
    reply = gateway.post({"content-type": "application/cloudevents+json"}, json.dumps(event))
    assert reply.status_code == 400 and reply.json()["field"] == field, reply.text


def test_malformed_extensions_are_refused_by_name(gateway: Gateway) -> None:
    base = {"specversion": "1.0", "id": "x", "source": "/curl", "type": TYPE, "data": DATA}
    for name, value in (("myExt", "a"), ("weight", 1.5), ("nested", {"a": 1}), ("big", 2**40)):
        reply = gateway.post({"content-type": "application/cloudevents+json"}, json.dumps({**base, name: value}))
        assert reply.status_code == 400 and reply.json()["field"] == f"/{name}", (name, reply.text)


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[str]:
    rt = Runtime(tmp_path / "run", auth=None, tick=0.05, model_grace=30)
    server = ServerThread(rt, port=free_port(), name="runtime").start()
    declared = {"inputs": [{"name": "features", "datatype": "FP32", "shape": [-1, 4]}],
                "outputs": [{"name": "score", "datatype": "FP32", "shape": [-1, 1]}]}
    for name, artifact, fmt, extra in (("onnx", models.onnx_model(tmp_path), "onnx", {}),
                                       ("sk", models.sklearn(tmp_path), "sklearn", {}),
                                       ("xgb", models.xgboost_model(tmp_path), "xgboost", {}),
                                       ("sd", models.state_dict(tmp_path), "pytorch", {}),
                                       ("ts", models.torchscript(tmp_path), "torchscript", {"signature": declared})):
        reply = httpx.put(f"{server.url}/_runtime/models/{name}/versions/1", timeout=120,
                          json={"artifact": str(artifact), "format": fmt, **extra})
        assert reply.status_code == 200, reply.text
    yield server.url
    server.stop()


def test_tritonclient_speaks_to_the_inference_gateway(runtime: str) -> None:
    client = triton.InferenceServerClient(runtime.removeprefix("http://"))
    assert client.is_server_live() and client.is_server_ready()
    assert client.get_server_metadata()["name"] == "cascade"
    assert client.is_model_ready("onnx") and client.is_model_ready("onnx", "1")
    meta = client.get_model_metadata("onnx")
    assert meta == client.get_model_metadata("onnx", "1") and meta["platform"] == "onnxruntime_onnx"
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]
    assert meta["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [-1, 1]}]
    assert client.get_model_metadata("sk")["inputs"] == [{"name": "input-0", "datatype": "FP32", "shape": [-1, 4]}]
    for name, platform in (("sk", "sklearn"), ("xgb", "xgboost"), ("sd", "pytorch_torchscript")):
        meta = client.get_model_metadata(name)  # the feature counts scikit-learn and XGBoost keep, arch.json
        assert meta["inputs"][0]["shape"] == [-1, 4] and meta["platform"] == platform, (name, meta)
    ts = client.get_model_metadata("ts")  # TorchScript declares no shapes: the release's signature
    assert (ts["inputs"][0]["name"], ts["outputs"][0]["name"]) == ("features", "score")
    rows = np.array([[1.0, 1.0, 1.0, 1.0], [2.0, 0.0, 0.0, 0.0]], dtype=np.float32)
    for binary in (False, True):
        tensor = triton.InferInput("x", list(rows.shape), "FP32")
        tensor.set_data_from_numpy(rows, binary_data=binary)
        for version in ("", "1"):
            result = client.infer("onnx", [tensor], model_version=version,
                                  outputs=[triton.InferRequestedOutput("y", binary_data=False)])
            assert result.as_numpy("y").flatten().tolist() == pytest.approx([2.5, 2.0], abs=1e-4), (binary, version)


def test_v1_listing_explain_and_v2_errors(runtime: str) -> None:
    assert httpx.get(f"{runtime}/v1/models").json() == {"models": ["onnx", "sd", "sk", "ts", "xgb"]}
    ready = httpx.get(f"{runtime}/v1/models/sk")
    assert ready.status_code == 200 and ready.json()["ready"] is True, ready.text
    predicted = httpx.post(f"{runtime}/v1/models/sk:predict", json={"instances": [[1.0, 1.0, 1.0, 1.0]]})
    assert predicted.json()["predictions"] == pytest.approx([2.5], abs=1e-4)
    explain = httpx.post(f"{runtime}/v1/models/onnx:explain", json={"instances": [[1, 1, 1, 1]]})
    assert explain.status_code == 501 and "explainer" in explain.json()["error"]
    malformed: dict[str, Any] = {"inputs": [{"name": "x", "shape": [1, 4]}]}  # no datatype, no data
    reply = httpx.post(f"{runtime}/v2/models/onnx/infer", json=malformed)
    assert reply.status_code == 400 and set(reply.json()) == {"error"}, reply.text
    missing = httpx.post(f"{runtime}/v2/models/nope/infer", json=malformed)
    assert missing.status_code == 404 and "error" in missing.json()
