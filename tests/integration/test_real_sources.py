"""Sources against the real tools: Label Studio 1.23.2 and MinIO, through a real `cascade up`.

Label Studio makes the annotations through its own REST API and posts its own webhooks;
MinIO posts its own bucket notifications (and queues them while the gateway is away).
Nothing here is a recorded body: the recorded ones live in tests/integration/test_gateway.py.
"""

from __future__ import annotations

import io
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from cascade.events.bus.embedded import EmbeddedBus
from cascade.events.identity import Projects
from cascade.stores.sqlite import SqliteStore
from tests.helpers.platform import PORTS, Running, cascade_up
from tests.helpers.tools import LS_TOKEN, LabelStudio, label_studio, minio, notify
from tests.helpers.waiting import eventually, holds

TOPIC = "cascade.events"
COMPLETED, SUBMITTED = "io.cascade.labels.completed.v1", "io.cascade.job.submitted.v1"
UPLOADED, REMOVED = "io.cascade.dataset.uploaded.v1", "io.cascade.dataset.removed.v1"


class Site:
    """One `cascade up` that can be stopped and started again on the same ports and home."""

    def __init__(self, home: Path) -> None:
        self.home, self.stack, self.env = home, ExitStack(), {"CASCADE_SOURCES__RECONCILE_SECONDS": "30"}
        self.running: Running | None = None
        self.tokens: dict[str, str] = {}

    def start(self) -> Running:
        self.stack = ExitStack()
        self.running = self.stack.enter_context(cascade_up(self.home, wait_for=("gateway",), **self.env))
        self.env.update({key: self.running.env[key] for key in PORTS.values()})
        return self.running

    def stop(self) -> None:
        self.stack.close()

    @property
    def up(self) -> Running:
        assert self.running is not None
        return self.running

    def cli(self, *args: str, token: str, **env: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([*self.up.command, *args], env={**self.up.env, "CASCADE_TOKEN": token, **env},
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done

    def events(self, kind: str) -> list[Any]:
        """Every event of type ``kind`` on the platform's bus so far."""
        bus = EmbeddedBus(self.home / "bus.db")
        consumer = bus.subscribe([TOPIC], f"check-{uuid.uuid4().hex}", start="earliest")
        seen: list[Any] = []
        try:
            while batch := consumer.poll(0.3):
                seen += [e for e in (r.event() for r in batch) if e["type"] == kind]
        finally:
            consumer.close()
            bus.close()
        return seen

    def completions(self, connection: str) -> list[Any]:
        return [e for e in self.events(COMPLETED) if e.get_data().get("connection") == connection]

    def connect(self, studio: LabelStudio, project_id: int, dataset: str, token: str) -> str:
        out = self.cli("sources", "label-studio", "connect", "--url", studio.url, "--project-id", str(project_id),
                       "--dataset", dataset, token=token, LABEL_STUDIO_API_KEY=LS_TOKEN).stdout
        assert out.startswith("connected ls-"), out
        return out.split()[1].rstrip(":")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    site = Site(tmp_path_factory.mktemp("sources") / "home")
    running = site.start()
    try:
        projects = Projects(SqliteStore(site.home / "state.db"))
        projects.create_project("beta")
        site.tokens = {"default": running.token, "beta": projects.create_token("beta")}
        yield site
    finally:
        site.stop()


@pytest.fixture(scope="module")
def studios(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LabelStudio, LabelStudio]]:
    root = tmp_path_factory.mktemp("label-studio")
    with label_studio(root / "a") as first, label_studio(root / "b") as second:
        yield first, second


def test_two_installs_numbered_alike_feed_two_projects_each_with_its_own_policy(
        site: Site, studios: tuple[LabelStudio, LabelStudio]) -> None:
    first, second = studios
    (pa, tasks_a), (pb, tasks_b) = first.project("images of a", 3), second.project("images of b", 3)
    assert pa == pb, "every Label Studio install numbers its projects from 1"
    for project, script in (("default", "a.py"), ("beta", "b.py")):
        spec = f'{{"framework": "pytorch", "entrypoint": {{"script": "{script}"}}, "resources": {{"accelerator": "0"}}}}'
        site.cli("jobs", "policy", "images", "--spec", spec, token=site.tokens[project])
    conn_a = site.connect(first, pa, "images", site.tokens["default"])
    conn_b = site.connect(second, pb, "images", site.tokens["beta"])
    listing = site.cli("sources", "ls", token=site.tokens["default"]).stdout
    assert conn_a in listing and conn_b not in listing and first.url in listing and LS_TOKEN not in listing
    assert [h["url"].split("connection=")[1] for h in first.webhooks()] == [conn_a], "connect registered the webhook"

    for studio, tasks in ((first, tasks_a), (second, tasks_b)):
        for task in tasks:
            studio.annotate(task)
    eventually(lambda: len(site.events(COMPLETED)) >= 2, 60, "a completion in each project")
    holds(lambda: len(site.events(COMPLETED)) == 2, 3.0, "exactly one completion each")
    done = {e["project"]: e.get_data() for e in site.events(COMPLETED)}
    assert {p: (d["connection"], d["dataset"], d["finished"], d["total"]) for p, d in done.items()} == {
        "default": (conn_a, "images", 3, 3), "beta": (conn_b, "images", 3, 3)}
    eventually(lambda: len(site.events(SUBMITTED)) >= 2, 60, "each project's policy submitted a job")
    jobs = {e["project"]: e.get_data()["spec"]["entrypoint"]["script"] for e in site.events(SUBMITTED)}
    assert jobs == {"default": "a.py", "beta": "b.py"}, "each project trained its own policy's spec"


def test_completion_follows_label_studio_count_of_finished_tasks(site: Site, studios: tuple[LabelStudio, LabelStudio]) -> None:
    studio = studios[0]
    overlap, overlap_tasks = studio.project("two annotators each", 2, maximum_annotations=2,
                                            overlap_cohort_percentage=100)
    skips, skip_tasks = studio.project("skipped counts as done", 2, skip_queue="IGNORE_SKIPPED")
    conn_overlap = site.connect(studio, overlap, "overlap", site.tokens["default"])
    conn_skips = site.connect(studio, skips, "skips", site.tokens["default"])
    for task in overlap_tasks:
        studio.annotate(task)
    studio.annotate(skip_tasks[0])
    studio.annotate(skip_tasks[1], skip=True)
    eventually(lambda: len(site.completions(conn_skips)) == 1, 60, "the project with a skipped task completed")
    assert studio.counts(overlap) == (0, 2), "Label Studio itself counts no task finished with one of two annotations"
    holds(lambda: site.completions(conn_overlap) == [], 3.0, "no completion after one annotation of two per task")


def test_relabelling_is_a_new_completion_and_editing_the_project_is_not(
        site: Site, studios: tuple[LabelStudio, LabelStudio]) -> None:
    studio = studios[0]
    pid, tasks = studio.project("relabelled later", 2)
    conn = site.connect(studio, pid, "relabel", site.tokens["default"])
    first = [studio.annotate(t) for t in tasks]
    eventually(lambda: len(site.completions(conn)) == 1, 60, "the first completion")
    studio.api("PATCH", f"/api/projects/{pid}/", json={"title": "relabelled later, renamed"})
    holds(lambda: len(site.completions(conn)) == 1, 3.0, "renaming the project is no new completion")
    studio.api("DELETE", f"/api/annotations/{first[0]}/")
    studio.annotate(tasks[0])
    eventually(lambda: len(site.completions(conn)) == 2, 60, "the corrected labels completed again")
    holds(lambda: len(site.completions(conn)) == 2, 3.0, "once")
    stamps = [e.get_data()["labelledAt"] for e in site.completions(conn)]
    assert stamps[0] < stamps[1]


def test_a_completion_while_the_gateway_is_down_is_published_when_it_is_back(
        site: Site, studios: tuple[LabelStudio, LabelStudio]) -> None:
    studio = studios[1]
    pid, tasks = studio.project("finished while we were away", 2)
    conn = site.connect(studio, pid, "offline", site.tokens["beta"])
    studio.annotate(tasks[0])
    site.stop()
    studio.annotate(tasks[1])  # Label Studio posts this webhook once, into a closed port, and never again
    site.start()
    eventually(lambda: len(site.completions(conn)) == 1, 60, "the reconciler found the completion on start")
    holds(lambda: len(site.completions(conn)) == 1, 3.0, "exactly once")
    assert site.completions(conn)[0]["project"] == "beta"


def test_minio_uploads_and_removals_arrive_and_tags_do_not(site: Site, tmp_path: Path) -> None:
    with minio(tmp_path / "minio", f"{site.up.gateway}/webhooks/s3", site.tokens["default"]) as server:
        client = server.client()
        client.make_bucket("photos")
        notify(client, "photos", ["s3:ObjectCreated:*", "s3:ObjectRemoved:*"])
        key = "cats/my photo+1 %25 é.jpg"

        def about(kind: str, name: str) -> list[Any]:
            return [e for e in site.events(kind) if e.get_data()["key"] == name]

        client.put_object("photos", key, io.BytesIO(b"meow"), 4)
        eventually(lambda: len(about(UPLOADED, key)) == 1, 60, "the upload announced")
        assert about(UPLOADED, key)[0].get_data()["uri"] == f"s3://photos/{key}"
        from minio.commonconfig import Tags

        tags = Tags.new_object_tags()
        tags["reviewed"] = "yes"
        client.set_object_tags("photos", key, tags)
        client.remove_object("photos", key)
        eventually(lambda: len(about(REMOVED, key)) == 1, 60, "the removal announced (after the tagging)")
        assert len(about(UPLOADED, key)) == 1, "tagging is not a new upload"

        site.stop()
        client.put_object("photos", "cats/late.jpg", io.BytesIO(b"late"), 4)  # MinIO queues it
        site.start()
        eventually(lambda: len(about(UPLOADED, "cats/late.jpg")) == 1, 90, "MinIO redelivered after the outage")
        holds(lambda: len(about(UPLOADED, "cats/late.jpg")) == 1, 2.0, "once")


def test_connect_checks_key_project_and_dataset_and_disconnect_cleans_up(
        site: Site, studios: tuple[LabelStudio, LabelStudio]) -> None:
    studio = studios[1]
    pid, _ = studio.project("connected then not", 1)
    headers = {"authorization": f"Bearer {site.tokens['beta']}"}
    body = {"url": studio.url, "apiKey": LS_TOKEN, "projectId": pid, "dataset": "images"}

    def post(**change: Any) -> httpx.Response:
        return httpx.post(f"{site.up.gateway}/v1/sources/label-studio", headers=headers, json={**body, **change},
                          timeout=30)

    assert post(apiKey="not-the-key").json()["field"] == "/apiKey"
    assert post(projectId=pid + 100).status_code == 404
    assert post(dataset="../up").json()["field"] == "/dataset"
    assert post(url="ftp://example.com").json()["field"] == "/url"
    before = {h["id"] for h in studio.webhooks()}
    conn = post().json()
    [hook] = [h for h in studio.webhooks() if h["id"] not in before]
    assert hook["url"].endswith(f"connection={conn['id']}") and hook["headers"]["Authorization"].startswith("Bearer ")
    gone = httpx.delete(f"{site.up.gateway}/v1/sources/{conn['id']}", headers=headers, timeout=30).json()
    assert gone == {"id": conn["id"], "removed": True, "note": "webhook removed"}
    assert hook["id"] not in {h["id"] for h in studio.webhooks()}
    replay = httpx.post(f"{site.up.gateway}/webhooks/label-studio?connection={conn['id']}",
                        headers={"authorization": hook["headers"]["Authorization"]}, json={"action": "PROJECT_UPDATED"})
    assert replay.status_code == 401, "the webhook's token is revoked with the connection"
