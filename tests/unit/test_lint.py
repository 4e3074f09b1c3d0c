"""The resource checklist: each rule fires on what it is about, says why, and stays quiet on a job that is fine."""

from __future__ import annotations

from typing import Any

from cascade.functions.training.lint import lint
from cascade.scheduling.placement import Inventory

FLAVORS = Inventory.from_dict({"flavors": [
    {"name": "dgx", "vendor": "nvidia", "model": "A100", "memoryGiB": 80, "nvlink": True, "networkGbps": 200,
     "rdma": "rdma/hca", "nodes": [{"name": "d1", "cards": 8}]},
    {"name": "pcie", "vendor": "nvidia", "model": "T4", "memoryGiB": 16, "networkGbps": 1, "nodes": [{"name": "p1", "cards": 8}]},
    {"name": "small", "vendor": "nvidia", "model": "P4", "memoryGiB": 8, "nodes": [{"name": "s1", "cards": 4}]}]}).flavors


def rules(flavor: str | None, **spec: Any) -> list[str]:
    body = {"framework": "pytorch", "entrypoint": {"script": "t.py"}, **spec}
    return [f.rule for f in lint(body, FLAVORS[flavor] if flavor else None)]


def test_a_well_fed_job_passes_and_cpu_jobs_are_not_linted() -> None:
    good = {"resources": {"accelerator": "8", "cpu": "32", "memory": "1280Gi", "rdma": True}, "workers": 2,
            "task": "vision"}
    assert rules("dgx", **good) == []
    assert rules(None, resources={"accelerator": "0", "cpu": "1", "memory": "1Gi"}) == []


def test_each_item_of_the_checklist() -> None:
    assert rules("dgx", resources={"accelerator": "1", "cpu": "4", "memory": "512Gi"}) == ["cpu-cores"]
    assert rules("dgx", resources={"accelerator": "2", "cpu": "16", "memory": "256Gi"}) == ["host-memory"], \
        "2 x 80 GiB of cards want 320 GiB of host memory"
    assert rules("pcie", resources={"accelerator": "8", "cpu": "64", "memory": "512Gi"}) == ["nvlink"]
    assert rules("pcie", resources={"accelerator": "1", "cpu": "8", "memory": "64Gi"}, workers=2) == ["rdma", "network"]
    assert rules("small", resources={"accelerator": "1", "cpu": "8", "memory": "64Gi"}, task="vision") == [
        "vision-memory"]
    assert rules("small", resources={"accelerator": "1", "cpu": "8", "memory": "64Gi"}, task="nlp") == []
    [finding] = lint({"resources": {"accelerator": "1", "cpu": "2", "memory": "300Gi"}}, FLAVORS["dgx"])
    assert "2 CPU cores" in finding.message and "resources.cpu" in finding.message, "it says what to change"
