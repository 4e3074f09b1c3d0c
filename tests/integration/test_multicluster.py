"""Several clusters in one inventory, against the real API server (reached twice, as two clusters with their
own kubeconfig entry and namespaces): the matcher chooses cluster and flavor together, says why not for every
other cluster, applies each cluster's own quota, and a job is followed and cancelled in the cluster it ran in."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from cascade.core.settings import Settings
from cascade.events import jobrecords
from cascade.events.envelope import new_event
from cascade.functions.training.launcher import TrainingLauncher
from tests.helpers.kube import Cluster, unique

pytestmark = pytest.mark.slow


def submitted(job_id: str, project: str, accelerator: str) -> Any:
    spec = {"framework": "pytorch", "entrypoint": {"script": "train.py"}, "resources": {"accelerator": accelerator}}
    return new_event("job.submitted", {"jobId": job_id, "project": project, "spec": spec}, source="/test",
                     subject=job_id, extensions={"project": project})


def test_the_matcher_chooses_cluster_and_flavor_together(cluster: Cluster, tmp_path: Path) -> None:
    project = unique("mc")
    for ns in (f"east-{project}", f"west-{project}"):
        cluster.namespace(ns)
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(yaml.safe_dump({"clusters": [
        {"name": "east", "kubeconfig": str(cluster.kubeconfig), "namespacePrefix": "east-",
         "flavors": [{"name": "a100", "vendor": "nvidia", "model": "A100", "memoryGiB": 80,
                      "nodes": [{"name": "e1", "cards": 8}]}],
         "quotas": {project: {"nvidia": 1}}},
        {"name": "west", "kubeconfig": str(cluster.kubeconfig), "namespacePrefix": "west-",
         "flavors": [{"name": "t4", "vendor": "nvidia", "model": "T4", "memoryGiB": 16,
                      "nodes": [{"name": "w1", "cards": 4}]}]}]}))
    cfg = Settings(home=tmp_path / "home")
    cfg.state.url = f"sqlite:///{tmp_path / 'state.db'}"
    cfg.training.inventory = inventory
    launcher = TrainingLauncher(cfg)

    assert launcher.handle(submitted("a100-job", project, "1(A100)")) is None
    assert launcher.handle(submitted("t4-job", project, "1(T4)")) is None
    east = cluster.custom.get_namespaced_custom_object("kubeflow.org", "v1", f"east-{project}", "pytorchjobs", "a100-job")
    west = cluster.custom.get_namespaced_custom_object("kubeflow.org", "v1", f"west-{project}", "pytorchjobs", "t4-job")
    assert east["metadata"]["namespace"] == f"east-{project}" and west["metadata"]["namespace"] == f"west-{project}"
    record = jobrecords.get(launcher.store, "a100-job") or {}
    assert record["cluster"] == "east" and record["placement"]["cluster"] == "east"
    assert record["placement"]["skipped"] == {}, "east came first and had room"
    assert (jobrecords.get(launcher.store, "t4-job") or {})["placement"]["skipped"]["east/a100"].startswith("wrong model")

    nowhere = launcher.handle(submitted("h100-job", project, "1(H100)"))
    reason = nowhere.get_data()["reason"]  # type: ignore[union-attr]
    assert "east/a100: wrong model" in reason and "west/t4: wrong model" in reason, "why not, for every cluster"
    over = launcher.handle(submitted("a100-again", project, "1(A100)"))
    assert over["type"] == "io.cascade.job.queued.v1"  # type: ignore[index]
    assert "quota exhausted on cluster east" in over.get_data()["reasons"]["east/a100"]  # type: ignore[union-attr]

    launcher.backend.cancel("t4-job")  # routed to west, where it runs
    with pytest.raises(k8s.ApiException) as gone:
        cluster.custom.get_namespaced_custom_object("kubeflow.org", "v1", f"west-{project}", "pytorchjobs", "t4-job")
    assert gone.value.status == 404
    changes = launcher.backend.reconcile()
    assert [(c.job_id, c.status, c.data["reason"]) for c in changes] == [("t4-job", "cancelled", "cancelled on request")], \
        "west's client reports the cancellation once; east's leaves west's jobs alone"
