"""Faults on the Kubernetes control plane: the job watcher heals when the API server goes away and comes back.

The API server of scripts/services.sh is restarted for real (``scripts/services.sh kube-restart``;
etcd keeps the objects). The watcher's watches break, reconnect with back-off from the
resource version they had, and the job's end still becomes exactly one lifecycle event.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from cascade.events.bus.embedded import EmbeddedBus
from cascade.functions.training.backends.kubernetes import KubernetesBackend
from cascade.functions.training.job import TrainingJob
from cascade.functions.training.watch import JobWatcher
from cascade.scheduling.placement import PodPlacement
from cascade.stores.sqlite import SqliteStore
from tests.helpers.kube import Cluster, unique
from tests.helpers.waiting import events_until

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def test_the_job_watcher_heals_after_the_api_server_restarts(cluster: Cluster, tmp_path: Path) -> None:
    prefix = unique("f") + "-"
    cluster.namespace(f"{prefix}team")
    store, bus = SqliteStore(tmp_path / "state.db"), EmbeddedBus(tmp_path / "bus.db")
    backend = KubernetesBackend(cluster.api, store, prefix)
    watcher = JobWatcher(backend, bus, "events", interval=600)  # only the watch can bring the change in time
    watcher.start()
    try:
        job = TrainingJob.from_spec("job-heal", "team", {"framework": "pytorch", "entrypoint": {"script": "/t.py"}})
        job = TrainingJob(job.id, job.project, job.spec, PodPlacement(image="img:1"))
        backend.launch(job, {})
        obj = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
               "metadata": {"namespace": f"{prefix}team", "name": job.name}}
        cluster.status(obj, {"conditions": [{"type": "Running", "status": "True"}]})
        events_until(bus, "events", lambda seen: len(seen) == 1, 30, keep=lambda e: e["type"].endswith("started.v1"),
                     what="job.started before the restart")
        started = time.monotonic()
        subprocess.run(["bash", str(ROOT / "scripts" / "services.sh"), "kube-restart"], check=True, timeout=180,
                       capture_output=True)
        restarted = time.monotonic() - started
        cluster.status(obj, {"conditions": [{"type": "Running", "status": "False"},
                                            {"type": "Succeeded", "status": "True"}]})
        marked = time.monotonic()
        [done] = events_until(bus, "events", lambda seen: len(seen) >= 1, 60,
                              keep=lambda e: e["type"].endswith("succeeded.v1"), what="job.succeeded after the restart")
        healed = time.monotonic() - marked
        print(f"\nAPI server down and back in {restarted:.1f} s; job.succeeded {healed:.1f} s after the operator "
              "wrote it, through the reconnected watch")
        assert done.get_data()["jobId"] == "job-heal"
        assert watcher.once() == 0, "nothing left to publish, nothing published twice"
    finally:
        watcher.stop()
        bus.close()
        store.close()
