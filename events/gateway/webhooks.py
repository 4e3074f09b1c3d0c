"""Webhook payloads -> CloudEvents, as pure functions (shapes in design.md section 8).

* S3 / MinIO bucket notifications: one ``dataset.uploaded`` per ``ObjectCreated`` record;
  other record kinds are counted and ignored. Keys arrive URL-encoded.
* Label Studio: ``labels.progressed`` per annotation action; for a project wired by hand (no
  connection), ``labels.completed`` once Label Studio counts every task finished.
* CVAT: ``labels.completed`` when a job's ``state`` becomes ``completed``; bodies are signed
  with ``X-Signature-256: sha256=<HMAC-SHA256(secret, body)>``.

Event ids derive from the source's own ids, so a retried delivery makes the same event.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any
from urllib.parse import unquote_plus

from cloudevents.http import CloudEvent

from cascade.core.errors import InvalidInput
from cascade.events.envelope import new_event
from cascade.events.gateway.errors import Unauthorized

ANNOTATION_ACTIONS = {"ANNOTATION_CREATED", "ANNOTATIONS_CREATED", "ANNOTATION_UPDATED", "ANNOTATIONS_DELETED"}


def _digest(*parts: object) -> str:
    return hashlib.sha256("\x00".join(str(p) for p in parts).encode()).hexdigest()[:32]


def _object(obj: Any, pointer: str) -> dict[str, Any]:
    """``obj`` at ``pointer``, which must be a JSON object."""
    node = _get(obj, pointer) if pointer else obj
    if not isinstance(node, dict):
        raise InvalidInput(f"{pointer or '/'} must be a JSON object", field=pointer or "/")
    return node


def _get(obj: Any, pointer: str) -> Any:
    node = obj
    for part in pointer.strip("/").split("/"):
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            raise InvalidInput(f"{pointer} is required", field=pointer)
    return node


UPLOADS = frozenset({"Put", "Post", "Copy", "CompleteMultipartUpload"})
"""``ObjectCreated:*`` names that are new data; MinIO's ``PutTagging``, ``DeleteTagging``, ``PutRetention``
and ``PutLegalHold`` are also ``ObjectCreated`` but change only metadata."""
REMOVALS = frozenset({"Delete", "DeleteMarkerCreated", "DeleteAllVersions"})


def s3_kind(event_name: str) -> str | None:
    """``"upload"``, ``"removal"`` or None (tagging, ACL, retention, reads, restores: nothing to announce)."""
    family, _, what = event_name.removeprefix("s3:").partition(":")
    if family == "ObjectCreated" and what in UPLOADS:
        return "upload"
    if family in ("ObjectRemoved", "LifecycleExpiration") and what in REMOVALS:
        return "removal"
    return None


def s3_events(payload: Any, project: str) -> tuple[list[CloudEvent], int]:
    """``dataset.uploaded`` per created object, ``dataset.removed`` per deleted one, and how many
    records were neither (ignored)."""
    records = _get(payload, "/Records")
    if not isinstance(records, list):
        raise InvalidInput("/Records must be a list of S3 event records", field="/Records")
    events, ignored = [], 0
    for i, rec in enumerate(records):
        origin = {"aws:s3": "aws-s3", "minio:s3": "minio"}.get(_get(rec, "/eventSource") if isinstance(rec, dict) else "")
        if origin is None:
            raise InvalidInput("eventSource must be 'aws:s3' or 'minio:s3'", field=f"/Records/{i}/eventSource")
        name = str(_get(rec, "/eventName"))
        kind = s3_kind(name)
        if kind is None:
            ignored += 1
            continue
        bucket = str(_get(rec, "/s3/bucket/name"))
        obj = _object(rec, "/s3/object")
        key = unquote_plus(str(_get(obj, "/key")))
        version = obj.get("sequencer") or obj.get("versionId") or obj.get("eTag") or ""
        data: dict[str, Any] = {"dataset": bucket, "uri": f"s3://{bucket}/{key}", "bucket": bucket, "key": key,
                                "origin": origin}
        if obj.get("versionId"):
            data["versionId"] = str(obj["versionId"])
        source, ext = f"/cascade/gateway/s3/{bucket}", {"project": project}
        if kind == "removal":
            events.append(new_event("dataset.removed", {**data, "reason": name}, source=source,
                                    id=f"s3rm-{_digest(project, bucket, key, version)}", subject=key,
                                    partitionkey=bucket, extensions=ext))
            continue
        size = obj.get("size", 0)
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise InvalidInput("object size must be a non-negative integer", field=f"/Records/{i}/s3/object/size")
        data["size"] = size
        if obj.get("eTag"):
            data["etag"] = str(obj["eTag"]).strip('"')
        events.append(new_event("dataset.uploaded", data, source=source,
                                id=f"s3-{_digest(project, bucket, key, version)}", subject=key, partitionkey=bucket,
                                extensions=ext))
    return events, ignored


def _ls_project(payload: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    project = payload.get("project")
    if isinstance(project, dict) and project.get("id") is not None:
        return str(project["id"]), project
    for path in ("annotation", "task"):
        node = payload.get(path)
        if isinstance(node, dict) and node.get("project") is not None:
            return str(node["project"]), {}
    raise InvalidInput("the Label Studio payload names no project (project.id)", field="/project/id")


def _count(info: dict[str, Any], key: str) -> int | None:
    n = info.get(key)
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else None


def label_studio_events(payload: Any, project: str, dataset: str | None = None,
                        connection: str | None = None) -> list[CloudEvent]:
    """``labels.progressed`` for annotation actions; without a ``connection``, also ``labels.completed`` when
    Label Studio's ``finished_task_number`` reaches ``task_number`` (connected projects complete through the
    reconciler, which asks Label Studio itself).

    Ids hold the Cascade project and the install (the connection, or the Label Studio project's creation
    time), since every install numbers its projects from 1. A completion's identity is the task count and
    the latest annotation change the payload shows, so relabelling is a new completion and a replay is not.
    """
    payload = _object(payload, "")
    action = str(_get(payload, "/action"))
    ls_id, info = _ls_project(payload)
    install = connection or str(info.get("created_at") or "")
    source = f"/cascade/sources/label-studio/{connection}" if connection else f"/cascade/gateway/label-studio/{ls_id}"
    base: dict[str, Any] = {"project": ls_id, "tool": "label-studio"}
    if dataset:
        base["dataset"] = dataset
    if connection:
        base["connection"] = connection
    total, annotated = _count(info, "task_number"), _count(info, "num_tasks_with_annotations")
    finished = _count(info, "finished_task_number")
    finished = annotated if finished is None else finished
    counts = {"annotated": annotated, "total": total} if total is not None and annotated is not None else {}
    ext, key = {"project": project}, f"ls-{_digest(project, install, ls_id)}"
    if action not in ANNOTATION_ACTIONS:
        return []
    annotations = payload.get("annotations", payload.get("annotation")) or {}
    annotations = [annotations] if isinstance(annotations, dict) else annotations
    if not isinstance(annotations, list):
        raise InvalidInput("annotations must be a list", field="/annotations")
    marks = [f"{a.get('id')}@{a.get('updated_at')}" for a in annotations if isinstance(a, dict)]
    events = [new_event("labels.progressed", {**base, **counts, "action": action}, source=source,
                        id=f"ls-{_digest(project, install, action, ls_id, *marks)}", partitionkey=key, extensions=ext)]
    task = payload.get("task")
    changed = [str(n["updated_at"]) for n in [task, *annotations] if isinstance(n, dict) and n.get("updated_at")]
    if connection is None and changed and total and finished is not None and finished >= total:
        labelled_at = max(changed)
        done = {**base, **counts, "finished": finished, "labelledAt": labelled_at}
        events.append(new_event("labels.completed", done, source=source,
                                id=f"ls-{_digest('completed', project, install, ls_id, total, labelled_at)}",
                                partitionkey=key, extensions=ext))
    return events


def verify_cvat_signature(secret: str, body: bytes, header: str | None) -> None:
    """Constant-time check of ``X-Signature-256``; raises Unauthorized."""
    if not secret:
        raise Unauthorized("CVAT webhooks are disabled: set CASCADE_GATEWAY__CVAT_SECRET", field="X-Signature-256")
    expected = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected.encode(), (header or "").encode()):
        raise Unauthorized("X-Signature-256 does not match the body", field="X-Signature-256")


def cvat_events(payload: Any, project: str) -> list[CloudEvent]:
    """``labels.completed`` when an ``update:job`` moves the job's state to ``completed``."""
    if _get(_object(payload, ""), "/event") != "update:job":
        return []
    job, before = _object(payload, "/job"), payload.get("before_update") or {}
    if not isinstance(before, dict):
        raise InvalidInput("before_update must be a JSON object", field="/before_update")
    if job.get("state") != "completed" or "state" not in before or before["state"] == "completed":
        return []
    job_id = str(_get(job, "/id"))
    owner = str(job.get("project_id") or job.get("task_id") or job_id)
    data = {"project": owner, "tool": "cvat", "job": job_id}
    ident = _digest(project, payload.get("webhook_id"), job_id, job.get("updated_date"))
    return [new_event("labels.completed", data, source=f"/cascade/gateway/cvat/{payload.get('webhook_id')}",
                      id=f"cvat-{ident}", partitionkey=f"cvat-{owner}", extensions={"project": project})]
