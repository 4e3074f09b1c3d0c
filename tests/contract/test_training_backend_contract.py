"""The TrainingBackend contract, written once and run against every backend.

Each backend gets a driver that knows how a job of it ends on its own (local: the worker
script exits; kubernetes: the operator's status condition, written into a real kube-apiserver with the
operator's CRD as the operator would) and how a job vanishes behind Cascade's back (local: the
supervisor is killed; kubernetes: the resource is deleted). The contract: launch, status,
logs, cancel, and reconcile after a restart, with the lifecycle event each change becomes.
"""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import pytest

from cascade.core.errors import NotFound
from cascade.core.settings import Settings
from cascade.events import jobrecords
from cascade.events.envelope import check_event
from cascade.functions.training.backends import TrainingBackend, lifecycle_event
from cascade.functions.training.backends.base import Change
from cascade.functions.training.backends.kubernetes import KubernetesBackend
from cascade.functions.training.backends.local import LocalBackend
from cascade.functions.training.job import TrainingJob
from cascade.scheduling.placement import PodPlacement
from cascade.stores.sqlite import SqliteStore
from tests.helpers.kube import Cluster, unique
from tests.helpers.waiting import eventually

WORKER = "import sys, time\nprint('hello from the worker', flush=True)\ntime.sleep(float(sys.argv[1]))\n" \
         "sys.exit(int(sys.argv[2]))\n"


class Driver(Protocol):
    backend: TrainingBackend
    store: SqliteStore

    def job(self, seconds: float, code: int = 0) -> TrainingJob: ...

    def restart(self) -> TrainingBackend:
        """The same backend as a new process would build it (same store, same cluster)."""
        ...

    def finish(self, job: TrainingJob, ok: bool) -> None:
        """Let ``job`` end on its own (a no-op where the worker ends itself)."""
        ...

    def vanish(self, job: TrainingJob) -> None:
        """Make ``job`` disappear without telling Cascade."""
        ...


class LocalDriver:
    def __init__(self, tmp_path: Path) -> None:
        self.cfg = Settings(home=tmp_path / "home")
        self.store = SqliteStore(tmp_path / "home" / "state.db")
        self.script = self.cfg.workspaces / "team" / "worker.py"  # a local job runs a script of its project's workspace
        self.script.parent.mkdir(parents=True)
        self.script.write_text(WORKER)
        self.backend: TrainingBackend = self.restart()

    def restart(self) -> TrainingBackend:
        return LocalBackend(self.cfg.artifact_root, self.store, self.cfg.export())

    def job(self, seconds: float, code: int = 0) -> TrainingJob:
        spec = {"framework": "pytorch", "entrypoint": {"script": "worker.py", "args": [str(seconds), str(code)]}}
        return TrainingJob.from_spec(f"job-{uuid.uuid4().hex[:8]}", "team", spec)

    def finish(self, job: TrainingJob, ok: bool) -> None:
        pass

    def vanish(self, job: TrainingJob) -> None:
        record = jobrecords.get(self.store, job.id) or {}
        os.killpg(int(record["supervisor"]), signal.SIGKILL)  # the supervisor and its workers

    def close(self) -> None:
        self.store.close()


class KubernetesDriver:
    """The real API server with the operators' CRDs; the test writes what the operator would."""

    def __init__(self, tmp_path: Path, cluster: Cluster) -> None:
        self.cluster, self.prefix = cluster, unique("t") + "-"
        cluster.namespace(f"{self.prefix}team")
        self.store = SqliteStore(tmp_path / "state.db")
        self.backend = self.restart()

    def restart(self) -> TrainingBackend:
        return KubernetesBackend(self.cluster.api, self.store, namespace_prefix=self.prefix)

    def job(self, seconds: float, code: int = 0) -> TrainingJob:
        spec = {"framework": "pytorch", "entrypoint": {"script": "/app/train.py"}}
        job = TrainingJob.from_spec(f"job-{uuid.uuid4().hex[:8]}", "team", spec)
        return TrainingJob(job.id, job.project, job.spec, PodPlacement(image="img:1"))

    def _object(self, job: TrainingJob) -> dict[str, Any]:
        return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                "metadata": {"namespace": f"{self.prefix}team", "name": job.name}}

    def finish(self, job: TrainingJob, ok: bool) -> None:
        self.cluster.status(self._object(job), {"conditions": [
            {"type": "Running", "status": "False"}, {"type": "Succeeded" if ok else "Failed", "status": "True"}]})

    def vanish(self, job: TrainingJob) -> None:
        self.cluster.custom.delete_namespaced_custom_object("kubeflow.org", "v1", f"{self.prefix}team", "pytorchjobs",
                                                            job.name)

    def close(self) -> None:
        self.store.close()


@pytest.fixture(params=["local", "kubernetes"])
def driver(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    d = LocalDriver(tmp_path) if request.param == "local" else KubernetesDriver(tmp_path, request.getfixturevalue("cluster"))
    yield d
    d.close()


def settle(backend: TrainingBackend) -> list[Change]:
    """A reconcile pass as the job watcher makes it: each change committed once its event would be out."""
    changes = backend.reconcile()
    for change in changes:
        if change.commit is not None:
            change.commit()
    return changes


class TestTrainingBackendContract:
    def test_a_launched_job_runs_to_success_and_shows_its_logs(self, driver: Any) -> None:
        job = driver.job(0.2)
        driver.backend.launch(job, {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"})
        assert jobrecords.get(driver.store, job.id)["status"] in ("launching", "running", "succeeded")
        driver.finish(job, ok=True)
        eventually(lambda: driver.backend.status(job.id) == "succeeded", 60, "the job succeeding")
        eventually(lambda: "hello from the worker" in driver.backend.logs(job.id) or
                   isinstance(driver.backend, KubernetesBackend), 30, "the worker's output in the logs")

    def test_a_failing_job_ends_failed(self, driver: Any) -> None:
        job = driver.job(0.1, code=3)
        driver.backend.launch(job, {})
        driver.finish(job, ok=False)
        eventually(lambda: driver.backend.status(job.id) == "failed", 60, "the job failing")

    def test_cancel_stops_a_running_job_and_a_second_cancel_does_nothing(self, driver: Any) -> None:
        job = driver.job(120)
        driver.backend.launch(job, {})
        driver.backend.cancel(job.id)
        eventually(lambda: driver.backend.status(job.id) == "cancelled", 60, "the job cancelled")
        driver.backend.cancel(job.id)
        assert driver.backend.status(job.id) == "cancelled"

    def test_unknown_jobs_are_not_found(self, driver: Any) -> None:
        with pytest.raises(NotFound):
            driver.backend.status("job-nobody-launched")
        with pytest.raises(NotFound):
            driver.backend.cancel("job-nobody-launched")

    def test_after_a_restart_reconcile_reports_a_vanished_job_once(self, driver: Any) -> None:
        running, done = driver.job(120), driver.job(0.1)
        driver.backend.launch(running, {"project": "team"})
        driver.backend.launch(done, {})
        driver.finish(done, ok=True)
        eventually(lambda: driver.backend.status(done.id) == "succeeded", 60, "the short job finishing")
        settle(driver.backend)  # whatever the backend had not recorded yet is recorded now
        eventually(lambda: jobrecords.get(driver.store, done.id)["status"] == "succeeded", 30, "the record final")
        after = driver.restart()
        assert after.reconcile() == [], "nothing changed while Cascade was away"
        driver.vanish(running)
        eventually(lambda: after.status(running.id) == "failed", 30, "the vanished job seen as failed")
        [change] = settle(after)
        assert (change.job_id, change.status) == (running.id, "failed") and change.extensions == {"project": "team"}
        event = lifecycle_event(change, "/tests")
        check_event(event)
        assert event["type"] == "io.cascade.job.failed.v1" and event["project"] == "team"
        assert jobrecords.get(driver.store, running.id)["status"] == "failed"
        assert after.reconcile() == [], "reported once"
