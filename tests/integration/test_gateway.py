"""The gateway against the real Kafka broker: every route, every rejection, nothing lost or doubled."""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cloudevents.http import CloudEvent
from fastapi.testclient import TestClient

from cascade.core.credentials import job_credential
from cascade.core.settings import GatewaySettings
from cascade.events import jobrecords
from cascade.events.bindings import http as ce_http
from cascade.events.bus.kafka import KafkaBus
from cascade.events.envelope import new_event
from cascade.events.gateway import create_app
from cascade.events.identity import Projects
from cascade.functions.training.lint import Linter
from cascade.functions.training.reporter import Reporter
from cascade.scheduling.placement import Inventory
from cascade.stores.sqlite import SqliteStore
from tests.conftest import drain, make_bus

SECRET = "cvat-secret"
PLATFORM = "casp_test-platform-credential"
UPLOAD = {"dataset": "cats", "uri": "s3://cats/1.jpg", "size": 3, "origin": "api"}


@dataclass
class Env:
    client: TestClient
    bus: KafkaBus
    topic: str
    alpha: str  # token of project alpha
    beta: str  # token of project beta
    store: SqliteStore

    def auth(self, token: str | None = None) -> dict[str, str]:
        return {"authorization": f"Bearer {token or self.alpha}"}

    def total(self) -> int:
        return sum(self.bus.end_offsets(self.topic).values())

    def landed(self, count: int) -> list[CloudEvent]:
        consumer = self.bus.subscribe([self.topic], f"check-{self.topic}-{self.total()}", start="earliest")
        records = drain(consumer, count)
        consumer.close()
        return [r.event() for r in records]


def build(tmp_path: Path, topic: str, **settings: Any) -> Env:
    bus = make_bus("kafka", tmp_path)
    assert isinstance(bus, KafkaBus)
    store = SqliteStore(tmp_path / "state.db")
    projects = Projects(store)
    projects.create_project("alpha")
    projects.create_project("beta")
    cfg = GatewaySettings(cvat_secret=SECRET, **settings)
    client = TestClient(create_app(bus, store, cfg, topic, platform_token=PLATFORM), base_url="http://localhost")
    return Env(client, bus, topic, projects.create_token("alpha"), projects.create_token("beta"), store)


@pytest.fixture
def env(tmp_path: Path, topic: str) -> Iterator[Env]:
    e = build(tmp_path, topic, max_body_bytes=64 * 1024)
    e.bus.ensure_topic(topic)
    yield e
    e.bus.close()


def uploaded(**kw: Any) -> CloudEvent:
    return new_event("dataset.uploaded", {**UPLOAD, **kw}, source="/client", partitionkey="cats")


# -- /events ------------------------------------------------------------------------------------------
def test_binary_event_lands_with_project_and_key(env: Env) -> None:
    event = uploaded()
    headers, body = ce_http.to_binary(event)
    reply = env.client.post("/events", headers={**headers, **env.auth()}, content=body)
    assert reply.status_code == 202, reply.text
    assert reply.json()["ids"] == [event["id"]]
    [got] = env.landed(1)
    assert got["id"] == event["id"] and got["project"] == "alpha" and got["partitionkey"] == "cats"
    assert got.get_data() == UPLOAD


def test_posts_to_events_take_the_fast_lane_and_still_meet_the_http_guard(
        env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    headers, body = ce_http.to_binary(uploaded())
    foreign = env.client.post("/events", headers={**headers, **env.auth(), "host": "evil.example"}, content=body)
    assert foreign.status_code == 400 and foreign.json()["field"] == "host"
    smuggled = env.client.post("/events%0d%0aX:%20y", headers={**headers, **env.auth()}, content=body)
    assert smuggled.status_code == 400 and smuggled.json()["field"] == "path"
    huge = env.client.post("/events", headers={**headers, **env.auth(), "content-length": str(10 << 20)},
                           content=body)
    assert huge.status_code == 413 and huge.json()["field"] == "content-length"
    assert env.client.get("/events").status_code == 405  # every other method goes through the app's router

    async def boom(topic: str, events: Any) -> Any:
        raise RuntimeError("a bug nobody handled")

    monkeypatch.setattr(env.client.app.state.gateway.committer, "publish_async", boom)  # type: ignore[attr-defined]
    with TestClient(env.client.app, base_url="http://localhost", raise_server_exceptions=False) as quiet:
        failed = quiet.post("/events", headers={**headers, **env.auth()}, content=body)
    assert failed.status_code == 500 and failed.json()["error"] == "InternalError", failed.text
    assert "a bug" not in failed.text
    metrics = env.client.get("/metrics").text
    assert 'cascade_gateway_requests_rejected_total{route="/events",status="413"} 1.0' in metrics
    assert env.total() == 0


def test_structured_and_batch_events_land(env: Env) -> None:
    headers, body = ce_http.to_structured(uploaded())
    assert env.client.post("/events", headers={**headers, **env.auth()}, content=body).status_code == 202
    batch = [uploaded(size=i) for i in range(100)]
    headers, body = ce_http.to_batch(batch)
    reply = env.client.post("/events", headers={**headers, **env.auth()}, content=body)
    assert reply.status_code == 202 and reply.json()["accepted"] == 100
    sizes = sorted(e.get_data()["size"] for e in env.landed(101))
    assert sizes == sorted([3] + list(range(100)))


# -- storage notifications ---------------------------------------------------------------------------
def s3_record(source: str, name: str, key: str, seq: str) -> dict[str, Any]:
    return {"eventVersion": "2.1", "eventSource": source, "awsRegion": "us-east-1", "eventName": name,
            "s3": {"s3SchemaVersion": "1.0", "bucket": {"name": "cats", "arn": "arn:aws:s3:::cats"},
                   "object": {"key": key, "size": 1024, "eTag": "d41d8cd98f00b204e9800998ecf8427e",
                              "versionId": "v1", "sequencer": seq}}}


def test_s3_notifications_become_one_event_per_created_or_removed_object_and_retries_do_not_double(env: Env) -> None:
    payload = {"Records": [s3_record("aws:s3", "ObjectCreated:Put", "train/my+photo%281%29.jpg", "0A1"),
                           s3_record("aws:s3", "ObjectRemoved:Delete", "train/old.jpg", "0A2"),
                           s3_record("aws:s3", "ObjectCreated:CompleteMultipartUpload", "train/b.jpg", "0A3"),
                           s3_record("minio:s3", "s3:ObjectCreated:PutTagging", "train/b.jpg", "0A4"),
                           s3_record("aws:s3", "ObjectAcl:Put", "train/b.jpg", "0A5"),
                           s3_record("minio:s3", "s3:ObjectCreated:PutRetention", "train/b.jpg", "0A6")]}
    reply = env.client.post("/webhooks/s3", json=payload, headers=env.auth())
    assert reply.status_code == 202
    assert (reply.json()["accepted"], reply.json()["ignored"]) == (3, 3), "tags, ACLs and retention are not data"
    again = env.client.post("/webhooks/s3", json=payload, headers=env.auth())
    assert (again.json()["accepted"], again.json()["duplicates"]) == (0, 3)
    events = env.landed(3)
    assert env.total() == 3, "the retried delivery published nothing"
    first = next(e for e in events if e["subject"].startswith("train/my"))
    assert first.get_data()["key"] == "train/my photo(1).jpg"
    assert first.get_data() | {} == {"dataset": "cats", "uri": "s3://cats/train/my photo(1).jpg", "bucket": "cats",
                                     "key": "train/my photo(1).jpg", "size": 1024, "origin": "aws-s3",
                                     "etag": "d41d8cd98f00b204e9800998ecf8427e", "versionId": "v1"}
    assert first["partitionkey"] == "cats" and first["type"] == "io.cascade.dataset.uploaded.v1"
    [removed] = [e for e in events if e["type"] == "io.cascade.dataset.removed.v1"]
    assert removed.get_data() == {"dataset": "cats", "uri": "s3://cats/train/old.jpg", "bucket": "cats",
                                  "key": "train/old.jpg", "versionId": "v1", "reason": "ObjectRemoved:Delete",
                                  "origin": "aws-s3"}


def test_the_same_notification_in_two_projects_is_two_deliveries(env: Env) -> None:
    payload = {"Records": [s3_record("minio:s3", "s3:ObjectCreated:Put", "a.jpg", "17A")]}
    assert env.client.post("/webhooks/s3", json=payload, headers=env.auth()).json()["accepted"] == 1
    assert env.client.post("/webhooks/s3", json=payload, headers=env.auth(env.beta)).json()["accepted"] == 1
    assert sorted(e["project"] for e in env.landed(2)) == ["alpha", "beta"]


def test_minio_notification(env: Env) -> None:
    payload = {"EventName": "s3:ObjectCreated:Put", "Key": "cats/a.jpg",
               "Records": [s3_record("minio:s3", "s3:ObjectCreated:Put", "a.jpg", "17A")]}
    assert env.client.post("/webhooks/s3", json=payload, headers=env.auth()).json()["accepted"] == 1
    [event] = env.landed(1)
    assert event.get_data()["origin"] == "minio"


# -- labelling tools ---------------------------------------------------------------------------------
def ls_payload(action: str, done: int, total: int = 10, annotation_id: int = 1, *, finished: int | None = None,
               at: str = "2026-11-30T10:00:00Z", created: str = "2026-11-01T08:00:00Z") -> dict[str, Any]:
    return {"action": action,
            "annotation": {"id": annotation_id, "task": 5, "project": 17, "result": [], "updated_at": at},
            "task": {"id": 5, "project": 17, "data": {"image": "s3://cats/1.jpg"}, "updated_at": at},
            "project": {"id": 17, "title": "Cats", "task_number": total, "num_tasks_with_annotations": done,
                        "finished_task_number": done if finished is None else finished, "created_at": created}}


def test_label_studio_progress_then_completion(env: Env) -> None:
    assert env.client.post("/webhooks/label-studio", json=ls_payload("ANNOTATION_CREATED", 4),
                           headers=env.auth()).json()["accepted"] == 1
    last = env.client.post("/webhooks/label-studio?dataset=cats", json=ls_payload("ANNOTATION_CREATED", 10, annotation_id=2),
                           headers=env.auth())
    assert last.json()["accepted"] == 2
    types = [(e["type"], e.get_data().get("annotated")) for e in env.landed(3)]
    assert types == [("io.cascade.labels.progressed.v1", 4), ("io.cascade.labels.progressed.v1", 10),
                     ("io.cascade.labels.completed.v1", 10)]
    replay = env.client.post("/webhooks/label-studio?dataset=cats", json=ls_payload("ANNOTATION_UPDATED", 10, annotation_id=2),
                             headers=env.auth())
    assert replay.json()["duplicates"] == 1, "completion is announced once"
    edited = env.client.post("/webhooks/label-studio?dataset=cats", json={**ls_payload("PROJECT_UPDATED", 10),
                                                                          "annotation": None, "task": None},
                             headers=env.auth())
    assert edited.json()["accepted"] == 0, "editing the project is not new labels"
    relabelled = env.client.post("/webhooks/label-studio?dataset=cats",
                                 json=ls_payload("ANNOTATION_UPDATED", 10, annotation_id=2, at="2026-11-30T11:00:00Z"),
                                 headers=env.auth())
    assert relabelled.json()["accepted"] == 2, "a later annotation change is a new completion"
    done = [e for e in env.landed(6) if e["type"] == "io.cascade.labels.completed.v1"]
    assert [e.get_data()["labelledAt"] for e in done] == ["2026-11-30T10:00:00Z", "2026-11-30T11:00:00Z"]


def test_label_studio_completion_follows_finished_tasks_and_installs_do_not_collide(env: Env) -> None:
    overlap = ls_payload("ANNOTATION_CREATED", 10, finished=0)  # every task has one of its two annotations
    assert env.client.post("/webhooks/label-studio?dataset=cats", json=overlap, headers=env.auth()).json()["accepted"] == 1
    bulk = {**ls_payload("ANNOTATIONS_CREATED", 10, annotation_id=3), "annotation": [
        {"id": 3, "updated_at": "2026-11-30T10:00:00Z"}, {"id": 4, "updated_at": "2026-11-30T10:00:00Z"}]}
    assert env.client.post("/webhooks/label-studio?dataset=cats", json=bulk, headers=env.auth()).json()["accepted"] == 2
    later = {**bulk, "annotation": [{"id": 5, "updated_at": "2026-11-30T10:00:00Z"}]}
    assert env.client.post("/webhooks/label-studio?dataset=cats", json=later, headers=env.auth()).json()["accepted"] == 1, \
        "a later ANNOTATIONS_CREATED batch is progress, not a duplicate"
    other_install = ls_payload("ANNOTATION_CREATED", 10, created="2026-10-02T09:00:00Z")  # also project 17
    assert env.client.post("/webhooks/label-studio?dataset=cats", json=other_install,
                           headers=env.auth(env.beta)).json()["accepted"] == 2
    done = [e for e in env.landed(6) if e["type"] == "io.cascade.labels.completed.v1"]
    assert sorted(e["project"] for e in done) == ["alpha", "beta"]


def test_label_studio_needs_a_token(env: Env) -> None:
    reply = env.client.post("/webhooks/label-studio", json=ls_payload("ANNOTATION_CREATED", 1))
    assert reply.status_code == 401 and reply.json()["field"] == "authorization"
    assert env.client.post("/webhooks/label-studio", json=ls_payload("ANNOTATION_CREATED", 1),
                           headers=env.auth("cas_wrong")).status_code == 401


def cvat_body(state: str, before: str | None) -> bytes:
    payload: dict[str, Any] = {"event": "update:job", "webhook_id": 3, "sender": {"username": "ann"},
                               "job": {"id": 42, "task_id": 7, "project_id": 2, "stage": "acceptance", "state": state,
                                       "updated_date": "2026-11-30T10:00:00Z"}}
    if before is not None:
        payload["before_update"] = {"state": before}
    return json.dumps(payload).encode()


def sign(body: bytes, secret: str = SECRET) -> dict[str, str]:
    digest = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return {"x-signature-256": f"sha256={digest}", "content-type": "application/json"}


def test_cvat_job_completed(env: Env) -> None:
    body = cvat_body("completed", "in progress")
    reply = env.client.post("/webhooks/cvat", content=body, headers=sign(body))
    assert reply.status_code == 202 and reply.json()["accepted"] == 1
    unchanged = cvat_body("completed", None)
    assert env.client.post("/webhooks/cvat", content=unchanged, headers=sign(unchanged)).json()["accepted"] == 0
    [event] = env.landed(1)
    assert event.get_data() == {"project": "2", "tool": "cvat", "job": "42"}
    assert event["project"] == "default"


def test_the_platform_cvat_secret_signs_for_no_other_project(env: Env) -> None:
    body = cvat_body("completed", "in progress")
    reply = env.client.post("/webhooks/cvat?project=alpha", content=body, headers=sign(body))
    assert reply.status_code == 403 and reply.json()["field"] == "project"
    assert "cascade sources cvat connect" in reply.json()["message"]
    assert env.total() == 0


def test_cvat_rejects_bad_signatures(env: Env) -> None:
    body = cvat_body("completed", "in progress")
    assert env.client.post("/webhooks/cvat", content=body, headers=sign(body, "other")).status_code == 401
    assert env.client.post("/webhooks/cvat", content=body).status_code == 401
    tampered = body.replace(b"42", b"43")
    assert env.client.post("/webhooks/cvat", content=tampered, headers=sign(body)).status_code == 401
    assert env.total() == 0


# -- jobs --------------------------------------------------------------------------------------------
SPEC = {"framework": "pytorch", "entrypoint": {"script": "train.py"}, "workers": 2, "resources": {"accelerator": "0"}}


def test_job_submission_lands_and_is_readable(env: Env) -> None:
    reply = env.client.post("/v1/jobs", json={"kind": "training", "spec": SPEC}, headers=env.auth())
    assert reply.status_code == 202, reply.text
    job_id = reply.json()["jobId"]
    [event] = env.landed(1)
    assert event["type"] == "io.cascade.job.submitted.v1" and event["partitionkey"] == job_id
    assert event.get_data() == {"jobId": job_id, "project": "alpha", "spec": SPEC}
    job = env.client.get(f"/v1/jobs/{job_id}", headers=env.auth()).json()
    assert (job["status"], job["spec"], job["project"]) == ("submitted", SPEC, "alpha")
    assert env.client.get(f"/v1/jobs/{job_id}", headers=env.auth(env.beta)).status_code == 404
    assert [j["id"] for j in env.client.get("/v1/jobs", headers=env.auth()).json()] == [job_id]


def test_finetune_submission_and_idempotency_key(env: Env) -> None:
    spec = {"baseModel": "/models/tiny", "dataset": "file:///d.jsonl", "method": "lora", "outputModel": "tiny-chat"}
    headers = {**env.auth(), "idempotency-key": "abc"}
    first = env.client.post("/v1/jobs", json={"kind": "finetune", "spec": spec}, headers=headers).json()
    second = env.client.post("/v1/jobs", json={"kind": "finetune", "spec": spec}, headers=headers).json()
    assert first["jobId"] == second["jobId"]
    [event] = env.landed(1)
    assert event["type"] == "io.cascade.finetune.submitted.v1"
    assert env.total() == 1


def test_the_resource_checklist_warns_by_default_and_refuses_where_the_project_asks(tmp_path: Path, topic: str) -> None:
    bus = make_bus("kafka", tmp_path)
    store = SqliteStore(tmp_path / "state.db")
    projects = Projects(store)
    for name in ("alpha", "strict"):
        projects.create_project(name)
    projects.set_lint("strict", "refuse")
    linter = Linter(Inventory.from_dict({"flavors": [
        {"name": "t4", "vendor": "nvidia", "model": "T4", "memoryGiB": 16, "nodes": [{"name": "n", "cards": 8}]}]}), store)
    client = TestClient(create_app(bus, store, GatewaySettings(), topic, check_job=linter.check),
                        base_url="http://localhost")
    spec = {**SPEC, "resources": {"accelerator": "1", "cpu": "2", "memory": "8Gi"}, "workers": 1}
    try:
        warned = client.post("/v1/jobs", json={"kind": "training", "spec": spec},
                             headers={"authorization": f"Bearer {projects.create_token('alpha')}"})
        assert warned.status_code == 202, warned.text
        assert [w.split(":")[0] for w in warned.json()["warnings"]] == ["cpu-cores", "host-memory"]
        assert jobrecords.get(store, warned.json()["jobId"])["warnings"] == warned.json()["warnings"]  # type: ignore[index]
        strict = client.post("/v1/jobs", json={"kind": "training", "spec": spec},
                             headers={"authorization": f"Bearer {projects.create_token('strict')}"})
        assert strict.status_code == 400 and "refuses" in strict.text and "cpu-cores" in strict.text, strict.text
        fine = {**spec, "resources": {"accelerator": "1", "cpu": "8", "memory": "32Gi"}}
        assert client.post("/v1/jobs", json={"kind": "training", "spec": fine},
                           headers={"authorization": f"Bearer {projects.create_token('strict')}"}).status_code == 202
        assert sum(bus.end_offsets(topic).values()) == 2, "the refused job published nothing"
    finally:
        bus.close()


def test_a_trials_reporter_turns_metrics_lines_into_trial_reported_with_its_credential_only(
        env: Env, tmp_path: Path) -> None:
    job = "exp-5e1f-t0"
    jobrecords.create(env.store, job, "training", "alpha", SPEC)
    url = f"/v1/jobs/{job}/reports"
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_bytes(b'{"step": 0, "loss": 0.9}\nnot json\n{"step": 1, "loss": 0.7, "note": "x"}\n{"step": 2, "lo')
    reporter = Reporter(metrics, url, job_credential(PLATFORM, job))
    assert reporter.post(env.client) and reporter.pending() == b"", "whole lines only: the half line waits"
    first = env.landed(2)
    assert [(e["type"], e["project"], e.get_data()) for e in first] == [
        ("io.cascade.trial.reported.v1", "alpha", {"jobId": job, "step": 0, "metrics": {"loss": 0.9}}),
        ("io.cascade.trial.reported.v1", "alpha", {"jobId": job, "step": 1, "metrics": {"loss": 0.7}})]
    with metrics.open("ab") as f:
        f.write(b'ss": 0.5}\n')
    assert reporter.post(env.client)
    assert env.landed(3)[-1].get_data() == {"jobId": job, "step": 2, "metrics": {"loss": 0.5}}
    again = env.client.post(url, content=metrics.read_bytes(), headers={"authorization": f"Bearer {job_credential(PLATFORM, job)}"})
    assert again.status_code == 202 and again.json()["accepted"] == 0, "a resent line is not published twice"
    body = b'{"step": 9, "loss": 0.1}\n'
    refusals = [(None, 401), (job_credential(PLATFORM, "exp-5e1f-t1"), 401), (job_credential("casp_other", job), 401),
                (env.alpha, 403), (env.beta, 403)]
    for token, status in refusals:
        reply = env.client.post(url, content=body, headers={"authorization": f"Bearer {token}"} if token else {})
        assert reply.status_code == status, (token, reply.text)
    unknown = env.client.post("/v1/jobs/exp-5e1f-t7/reports", content=body,
                              headers={"authorization": f"Bearer {job_credential(PLATFORM, 'exp-5e1f-t7')}"})
    assert unknown.status_code == 404
    assert env.total() == 3, "no refused report reached the bus"


# -- bad input ---------------------------------------------------------------------------------------
def test_every_bad_input_gets_its_status_and_publishes_nothing(env: Env) -> None:
    good_headers, good_body = ce_http.to_binary(uploaded())
    bad_size_headers, bad_size_body = ce_http.to_binary(uploaded())
    cases: list[tuple[int, dict[str, str], bytes, str | None]] = [
        (400, {"content-type": ce_http.STRUCTURED}, b'{"specversion": "1.0", "type": "x"}', None),
        (400, {"content-type": ce_http.STRUCTURED}, b"{not json", None),
        (415, {"content-type": "text/plain"}, b"hello", "content-type"),
        (413, {"content-type": ce_http.STRUCTURED}, b" " * (65 * 1024), "content-length"),
        (422, {**bad_size_headers}, bad_size_body.replace(b'"size":3', b'"size":-3'), "/data/size"),
        (422, {**good_headers, "ce-type": "io.cascade.unknown.v1"}, good_body, "/type"),
        (403, {**good_headers, "ce-project": "beta"}, good_body, "/project"),
    ]
    for status, headers, body, field in cases:
        reply = env.client.post("/events", headers={**headers, **env.auth()}, content=body)
        assert reply.status_code == status, (status, reply.text)
        assert reply.json()["message"]
        if field:
            assert reply.json()["field"] == field, reply.json()
    assert env.client.post("/events", headers=good_headers, content=good_body).status_code == 401
    job = env.client.post("/v1/jobs", json={"kind": "training", "spec": {**SPEC, "workers": 0}}, headers=env.auth())
    assert job.status_code == 422 and job.json()["field"] == "/spec/workers"
    assert env.client.post("/v1/jobs", json={"kind": "painting", "spec": SPEC}, headers=env.auth()).status_code == 400
    assert env.client.get("/v1/jobs", headers=env.auth()).json() == [], "no record kept for rejected jobs"
    s3 = env.client.post("/webhooks/s3", json={"Records": [{"eventSource": "gcs"}]}, headers=env.auth())
    assert s3.status_code == 400 and s3.json()["field"] == "/Records/0/eventSource"
    assert env.total() == 0


def test_a_batch_with_one_bad_event_publishes_nothing(env: Env) -> None:
    events = [uploaded(), uploaded(), uploaded()]
    headers, body = ce_http.to_batch(events)
    body = body.replace(b'"size":3', b'"size":"three"', 2).replace(b'"size":"three"', b'"size":3', 1)
    reply = env.client.post("/events", headers={**headers, **env.auth()}, content=body)
    assert reply.status_code == 422 and reply.json()["field"] == "/1/data/size"
    assert env.total() == 0


def test_rate_limit_per_project(tmp_path: Path, topic: str) -> None:
    env = build(tmp_path, topic, rate_per_second=1.0, burst=3)
    headers, body = ce_http.to_batch([uploaded(), uploaded(), uploaded()])
    assert env.client.post("/events", headers={**headers, **env.auth()}, content=body).status_code == 202
    one_h, one_b = ce_http.to_binary(uploaded())
    limited = env.client.post("/events", headers={**one_h, **env.auth()}, content=one_b)
    assert limited.status_code == 429 and int(limited.headers["retry-after"]) >= 1
    assert env.client.post("/events", headers={**one_h, **env.auth(env.beta)}, content=one_b).status_code == 202
    assert env.total() == 4
    env.bus.close()


def test_bus_down_means_503_and_nothing_accepted(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db")
    projects = Projects(store)
    projects.create_project("alpha")
    token = projects.create_token("alpha")
    down = KafkaBus("127.0.0.1:1", request_timeout=1.0)
    client = TestClient(create_app(down, store, GatewaySettings(), "cascade.events"), base_url="http://localhost")
    headers, body = ce_http.to_binary(uploaded())
    reply = client.post("/events", headers={**headers, "authorization": f"Bearer {token}"}, content=body)
    assert reply.status_code == 503 and reply.headers["retry-after"]
    job = client.post("/v1/jobs", json={"spec": SPEC}, headers={"authorization": f"Bearer {token}"})
    assert job.status_code == 503
    assert store.find_records("job") == [], "the job record was withdrawn"
    assert client.get("/readyz").status_code == 503
    assert client.get("/healthz").status_code == 200
    down.close()


def test_operations_endpoints(env: Env) -> None:
    assert env.client.get("/healthz").json() == {"status": "ok"}
    assert env.client.get("/readyz").status_code == 200
    headers, body = ce_http.to_binary(uploaded())
    env.client.post("/events", headers={**headers, **env.auth()}, content=body)
    env.client.post("/events", headers={"content-type": "text/plain", **env.auth()}, content=b"x")
    metrics = env.client.get("/metrics").text
    assert 'cascade_gateway_events_accepted_total{route="/events",type="io.cascade.dataset.uploaded.v1"} 1.0' in metrics
    assert 'cascade_gateway_requests_rejected_total{route="/events",status="415"} 1.0' in metrics
    spec = env.client.get("/openapi.json").json()
    assert {"/events", "/webhooks/s3", "/webhooks/label-studio", "/webhooks/cvat", "/v1/jobs"} <= set(spec["paths"])


@pytest.mark.parametrize("route, payload", [
    ("/webhooks/s3", []),
    ("/webhooks/s3", {"Records": "x"}),
    ("/webhooks/s3", {"Records": [1]}),
    ("/webhooks/s3", {"Records": [{"eventSource": "aws:s3", "eventName": "ObjectCreated:Put",
                                   "s3": {"bucket": {"name": "b"}, "object": 5}}]}),
    ("/webhooks/s3", {"Records": [{"eventSource": "aws:s3", "eventName": "ObjectCreated:Put",
                                   "s3": {"bucket": {"name": "b"}, "object": {"key": "k", "size": -1}}}]}),
    ("/webhooks/label-studio", "text"),
    ("/webhooks/label-studio", {"action": "ANNOTATION_CREATED"}),
    ("/webhooks/label-studio", {"action": "ANNOTATION_CREATED", "project": {"id": 1}, "annotations": 5}),
])
def test_malformed_webhooks_are_4xx(env: Env, route: str, payload: Any) -> None:
    reply = env.client.post(route, json=payload, headers=env.auth())
    assert 400 <= reply.status_code < 500, reply.text
    assert reply.json()["field"]


@pytest.mark.parametrize("payload", ["text", {"event": "update:job", "job": 5},
                                     {"event": "update:job", "job": {"id": 1, "state": "completed"}, "before_update": 3}])
def test_malformed_cvat_payloads_are_400(env: Env, payload: Any) -> None:
    body = json.dumps(payload).encode()
    assert env.client.post("/webhooks/cvat", content=body, headers=sign(body)).status_code == 400
