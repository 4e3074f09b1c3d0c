"""The scheduler books what it places, on a real `cascade up` (Kafka, Redis, the local backend): three 8-card
jobs on one 8-card node run one at a time, the others wait with the reason; a job cancelled while it waits is
dropped; each end admits the next."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
import yaml

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
        {"name": "cpu", "vendor": "cpu", "nodes": [{"name": "box-cpu", "cards": 0}]}]}))
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
    [first] = [j for j in jobs if of(j, "started")]
    waiting = [j for j in jobs if of(j, "queued")]
    assert len(waiting) == 2, [e["type"] for e in seen]
    reason = of(waiting[0], "queued")[0].get_data()["reasons"]["box"]  # type: ignore[attr-defined]
    assert "not enough free cards" in reason, reason
    record = httpx.get(f"{p.gateway}/v1/jobs/{waiting[0]}", headers=auth).json()
    assert record["status"] == "queued" and "not enough free cards" in record["reason"]

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
