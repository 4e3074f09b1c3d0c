"""`cascade nodes probe --kubernetes` against the real API server: nodes as the device plugins and GPU feature
discovery leave them (allocatable resources, product labels, taints) become an inventory the matcher places on."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cascade.scheduling.accelerators import parse
from cascade.scheduling.matcher import Matcher
from cascade.scheduling.placement import Inventory, Job
from tests.helpers.kube import Cluster, unique


def node(name: str, allocatable: dict[str, str], labels: dict[str, str] | None = None,
         taints: list[dict[str, str]] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels or {}},
            "spec": {"taints": taints or []},
            "status": {"capacity": allocatable, "allocatable": allocatable}}


@pytest.fixture
def nodes(cluster: Cluster) -> Iterator[dict[str, str]]:
    names = {k: unique(k) for k in ("a100", "ascend", "cpu")}
    made = [
        node(names["a100"], {"cpu": "96", "memory": "1056499708Ki", "nvidia.com/gpu": "8", "rdma/hca_shared_devices_a": "1k"},
             {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.memory": "81920"},
             [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]),
        node(names["ascend"], {"cpu": "192", "memory": "1536Gi", "huawei.com/Ascend910": "8"},
             {"accelerator": "huawei-Ascend910"}),
        node(names["cpu"], {"cpu": "32", "memory": "128Gi"})]
    for doc in made:
        cluster.core.create_node(doc)
    yield names
    for name in names.values():
        cluster.core.delete_node(name)


def test_nodes_probe_reads_the_clusters_nodes_into_an_inventory(cluster: Cluster, nodes: dict[str, str],
                                                                 tmp_path: Path) -> None:
    out = tmp_path / "inventory.yaml"
    done = subprocess.run([sys.executable, "-m", "cascade.cli", "nodes", "probe", "--kubernetes", "--output", str(out)],
                          env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    doc = yaml.safe_load(out.read_text())
    ours = {f["name"]: f for f in doc["flavors"] if any(n["name"] in nodes.values() for n in f["nodes"])}
    a100 = ours["nvidia-a100"]
    assert (a100["vendor"], a100["model"], a100["memoryGiB"], a100["rdma"]) == ("nvidia", "A100", 80.0,
                                                                                 "rdma/hca_shared_devices_a")
    assert a100["nodeLabels"] == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
    assert a100["taints"] == [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]
    assert a100["nodes"] == [{"name": nodes["a100"], "cpu": 96.0, "hostMemoryGiB": 1007.6, "cards": 8}]
    ascend = ours["huawei-910"]
    assert ascend["model"] == "910" and ascend["nodes"][0]["cards"] == 8
    assert ascend["nodeLabels"] == {"accelerator": "huawei-Ascend910"}
    assert [n["name"] for n in ours["cpu"]["nodes"] if n["name"] in nodes.values()] == [nodes["cpu"]]
    placed = Matcher(Inventory.from_dict({"flavors": list(ours.values())})).place(
        Job("j", parse("8(A100)"), 1, rdma=True, cpu=32, memory_gib=256))
    assert placed.pod().node_selector == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
    assert placed.pod().tolerations == ({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},)
