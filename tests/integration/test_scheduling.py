"""The scheduler books what it places, on a real `cascade up` (Kafka, Redis, the local backend): three 8-card
jobs on one 8-card node run one at a time, the others wait with the reason; a job cancelled while it waits is
dropped; each end admits the next. Two projects of a cohort share the node: one borrows the other's idle quota,
the other takes it back by preemption, and the preempted job runs again later from its checkpoint."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import yaml

from cascade.events.identity import Projects
from cascade.stores.redis import RedisStore
from tests.helpers.waiting import events_until, eventually
from tests.integration.test_training import HELPERS, Platform, running_platform

pytestmark = pytest.mark.slow
STORE = "redis://127.0.0.1:6379/3"


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    home = tmp_path_factory.mktemp("sched")
    inventory = home / "inventory.yaml"
    inventory.write_text(yaml.safe_dump({"flavors": [
        {"name": "box", "vendor": "nvidia", "model": "A100", "memoryGiB": 80, "nodes": [{"name": "box", "cards": 8}]},
        {"name": "cpu", "vendor": "cpu", "nodes": [{"name": "box-cpu", "cards": 0}]}],
        "quotas": {"default": {"nvidia": 4}, "team": {"nvidia": 4}}, "cohorts": {"lab": ["default", "team"]}}))
    redis.Redis.from_url(STORE).flushdb()  # the scheduler's bookings are the platform's: a database of its own
    with running_platform(home, f"sched-{uuid.uuid4().hex[:8]}", state=STORE,
                          CASCADE_TRAINING__INVENTORY=str(inventory)) as (p, _):
        yield p


def test_eight_card_jobs_on_one_eight_card_node_wait_their_turn(platform: Platform, tmp_path: Path) -> None:
    p = platform
    auth = {"authorization": f"Bearer {p.token}"}
    flags = {}
    jobs = []
    for n in range(3):
        flag = tmp_path / f"go-{n}"
        job_id = p.submit({"framework": "pytorch", "entrypoint": {"script": str(HELPERS / "hold.py"), "args": [str(flag)]},
                           "resources": {"accelerator": "8(A100)"}, "timeoutSeconds": 200})
        flags[job_id] = flag
        jobs.append(job_id)

    def of(job_id: str, kind: str) -> list[object]:
        return [e for e in seen if e.get("subject") == job_id and e["type"] == f"io.cascade.job.{kind}.v1"]

    seen = events_until(p.bus, p.topic, lambda s: sum(e["type"].endswith(("started.v1", "queued.v1")) for e in s) >= 3,
                        120, keep=lambda e: e.get("subject") in jobs, what="one start and two queued")
    started = [j for j in jobs if of(j, "started")]
    assert len(started) == 1, [(e["type"], e.get("subject"), e.get_data()) for e in seen]
    [first] = started
    waiting = [j for j in jobs if of(j, "queued")]
    assert len(waiting) == 2, [e["type"] for e in seen]
    reason = of(waiting[0], "queued")[0].get_data()["reasons"]["box"]  # type: ignore[attr-defined]
    assert "uses 8 of 4 nvidia cards; cohort lab has 0 unused to lend" in reason, reason  # the first borrowed team's
    record = httpx.get(f"{p.gateway}/v1/jobs/{waiting[0]}", headers=auth).json()
    assert record["status"] == "queued" and "cohort lab has 0 unused to lend" in record["reason"]

    dropped, second = waiting
    cancel = subprocess.run([*p.running.command, "jobs", "cancel", dropped], capture_output=True, text=True,
                            env={**p.running.env, "CASCADE_STATE__URL": STORE}, timeout=60)  # the platform's store
    assert cancel.returncode == 0, cancel.stderr
    eventually(lambda: httpx.get(f"{p.gateway}/v1/jobs/{dropped}", headers=auth).json()["status"] == "cancelled", 30,
               "the waiting job cancelled")
    flags[first].touch()  # the first ends: its cards go to the next waiting job
    admitted = events_until(p.bus, p.topic, lambda s: bool(s), 120, what=f"{second} admitted",
                            keep=lambda e: e["type"] == "io.cascade.job.admitted.v1")
    assert [e["subject"] for e in admitted] == [second], "the cancelled job was dropped, not admitted"
    assert admitted[0].get_data()["placement"]["nodes"] == ["box"] and admitted[0]["project"] == "default"
    flags[second].touch()
    assert "succeeded" in p.outcome(second, 120)
    assert "succeeded" in p.outcome(first, 10)
    assert httpx.get(f"{p.gateway}/v1/jobs/{dropped}", headers=auth).json()["status"] == "cancelled"


def test_a_project_takes_its_quota_back_and_the_preempted_job_resumes_from_its_checkpoint(
        platform: Platform, tmp_path: Path) -> None:
    p = platform
    projects = Projects(RedisStore(STORE))
    projects.create_project("team")
    team = projects.create_token("team")
    go = {"borrower": tmp_path / "go-borrower", "owner": tmp_path / "go-owner"}
    borrower = p.submit({"framework": "pytorch", "entrypoint": {"script": str(HELPERS / "hold.py"),
                                                                "args": [str(go["borrower"])]},
                         "resources": {"accelerator": "8(A100)"}, "timeoutSeconds": 200})
    eventually(lambda: "started fresh" in p.logs(borrower), 60, "the borrower running on all 8 cards")
    workspace = p.home / "workspaces" / "team"
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "hold.py").write_text((HELPERS / "hold.py").read_text())
    owner = httpx.post(f"{p.gateway}/v1/jobs", headers={"authorization": f"Bearer {team}"}, json={
        "kind": "training", "spec": {"framework": "pytorch", "entrypoint": {"script": "hold.py", "args": [str(go["owner"])]},
                                     "resources": {"accelerator": "4(A100)"}, "timeoutSeconds": 200}})
    assert owner.status_code == 202, owner.text
    owner_id = owner.json()["jobId"]

    def stopped(seen: list[Any]) -> list[Any]:
        return [e for e in seen if e["subject"] == borrower and e["type"].endswith(("cancelled.v1", "queued.v1"))]

    # The borrower's run reports job.cancelled when its supervisor has stopped it, which may come after the owner
    # has started: wait for both, in either order.
    seen = events_until(p.bus, p.topic, lambda s: any(e["type"].endswith("job.started.v1") and e["subject"] == owner_id
                                                      for e in s) and
                        {e["type"].split(".")[3] for e in stopped(s)} >= {"cancelled", "queued"}, 120,
                        what="the owner started and the borrower stopped and queued again",
                        keep=lambda e: e.get("subject") in (borrower, owner_id))
    assert all("team reclaimed its quota in cohort lab" in json.dumps(e.get_data()) for e in stopped(seen))
    eventually(lambda: httpx.get(f"{p.gateway}/v1/jobs/{borrower}", headers={"authorization": f"Bearer {p.token}"})
               .json()["status"] == "queued", 30, "the borrower waiting again")
    go["borrower"].touch()
    go["owner"].touch()  # the owner ends: the borrower is admitted again and resumes
    [done] = events_until(p.bus, p.topic, bool, 120, what=f"{borrower} to succeed after its second run",
                          keep=lambda e: e.get("subject") == borrower and e["type"].endswith("job.succeeded.v1"))
    assert done.get_data()["metrics"] == {"resumed": 1.0}, "its output, with the checkpoint, was kept"
    admitted = events_until(p.bus, p.topic, bool, 10, what="the borrower admitted again",
                            keep=lambda e: e.get("subject") == borrower and e["type"].endswith("job.admitted.v1"))
    assert admitted[0].get_data()["placement"]["nodes"] == ["box"]
    assert "succeeded" in p.outcome(owner_id, 60)
