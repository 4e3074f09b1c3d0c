"""Accelerator request strings, vendors' resource names, and placement on Kueue-style flavors."""

from __future__ import annotations

from typing import Any

import pytest

from cascade.core.errors import InvalidInput
from cascade.scheduling import frameworks
from cascade.scheduling.accelerators import parse, resources
from cascade.scheduling.matcher import Matcher
from cascade.scheduling.placement import Inventory, Job, NoFit


@pytest.mark.parametrize("text, count, vendor, model, memory, mig", [
    ("0", 0, None, None, None, None),
    ("2", 2, None, None, None, None),
    ("1(V100)", 1, "nvidia", "V100", None, None),
    ("1(npu,910B)", 1, "huawei", "910B", None, None),
    ("0.5", 0.5, None, None, None, None),
    ("8G,0.5", 0.5, None, None, 8, None),
    ("1(mig-1g.10gb)", 1, "nvidia", None, None, "1g.10gb"),
    ("4(amd,MI300X)", 4, "amd", "MI300X", None, None),
    ("2(gaudi)", 2, "gaudi", None, None, None),
])
def test_request_strings(text: str, count: float, vendor: str | None, model: str | None, memory: float | None,
                         mig: str | None) -> None:
    r = parse(text)
    assert (r.count, r.vendor, r.model, r.memory_gib, r.mig) == (count, vendor, model, memory, mig)


@pytest.mark.parametrize("bad", ["", "two", "1.5", "-1", "8G,2", "1(a,b,c)", "0(V100)", "1(", "G,0.5", "100"])
def test_malformed_requests_show_the_accepted_forms(bad: str) -> None:
    with pytest.raises(InvalidInput, match=r"1\(npu,910B\)"):
        parse(bad)


@pytest.mark.parametrize("text, vendor, sharing, expected", [
    ("2", "nvidia", "hami", {"nvidia.com/gpu": "2"}),
    ("1(mig-3g.40gb)", "nvidia", "hami", {"nvidia.com/mig-3g.40gb": "1"}),
    ("0.5", "nvidia", "hami", {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "50", "nvidia.com/gpumem": "16384"}),
    ("8G,0.25", "nvidia", "tencent", {"tencent.com/vcuda-core": "25", "tencent.com/vcuda-memory": "32"}),
    ("1(910B)", "huawei", "none", {"huawei.com/Ascend910": "1"}),
    ("1(npu,310)", "huawei", "none", {"huawei.com/Ascend310": "1"}),
    ("2(npu,310P)", "huawei", "none", {"huawei.com/Ascend310P": "2"}),
    ("1", "amd", "none", {"amd.com/gpu": "1"}),
    ("1", "intel", "none", {"gpu.intel.com/i915": "1"}),
    ("8", "gaudi", "none", {"habana.ai/gaudi": "8"}),
    ("1", "cambricon", "none", {"cambricon.com/mlu": "1"}),
    ("1", "hygon", "none", {"hygon.com/dcu": "1"}),
    ("1", "kunlun", "none", {"kunlunxin.com/xpu": "1"}),
    ("0", "cpu", "none", {}),
])
def test_resource_names_per_vendor(text: str, vendor: str, sharing: str, expected: dict[str, str]) -> None:
    assert resources(parse(text), vendor, sharing=sharing, card_memory_gib=32) == expected


def test_rdma_is_an_extra_resource() -> None:
    assert resources(parse("8"), "nvidia", rdma="rdma/hca_shared_devices_a") == {
        "nvidia.com/gpu": "8", "rdma/hca_shared_devices_a": "1"}


INVENTORY: dict[str, Any] = {
    "flavors": [
        {"name": "t4", "vendor": "nvidia", "model": "T4", "memoryGiB": 16, "nodeLabels": {"gpu-type": "T4"},
         "nodes": [{"name": "t4-a", "cards": 4}]},
        {"name": "a100", "vendor": "nvidia", "model": "A100", "memoryGiB": 80, "nodeLabels": {"gpu-type": "A100"},
         "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
         "nodes": [{"name": "a100-a", "cards": 8}, {"name": "a100-b", "cards": 2}]},
        {"name": "ascend", "vendor": "npu", "model": "910B", "memoryGiB": 64, "sharing": "none",
         "nodeLabels": {"accelerator": "huawei-Ascend910"}, "nodes": [{"name": "npu-a", "cards": 8}]},
        {"name": "cpu", "vendor": "cpu", "nodes": [{"name": "cpu-a"}]},
    ],
    "queues": [{"name": "default", "flavors": ["t4", "a100", "ascend", "cpu"]}],
    "quotas": {"small": {"nvidia": 2}},
}


def matcher(**kw: Any) -> Matcher:
    return Matcher(Inventory.from_dict(INVENTORY), **kw)


def job(text: str, workers: int = 1, **kw: Any) -> Job:
    return Job(kw.pop("id", "j"), parse(text), workers, **kw)


def test_first_flavor_with_room_wins_and_carries_selector_tolerations_and_limits() -> None:
    m = matcher()
    placement = m.submit(job("2(A100)", workers=1))
    fields = placement.manifest_fields()
    assert fields["flavor"] == "a100" and fields["nodeSelector"] == {"gpu-type": "A100"}
    assert fields["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Equal", "value": "present",
                                      "effect": "NoSchedule"}]
    assert fields["limits"] == {"nvidia.com/gpu": "2"} and fields["nodes"] == ["a100-b"], "best fit: the 2-card node"
    assert fields["image"] == frameworks.image("pytorch", "nvidia")
    assert placement.skipped == {"t4": "wrong model: the job wants A100, this flavor is T4"}


def test_best_fit_keeps_big_nodes_whole() -> None:
    m = matcher()
    assert m.submit(job("1(A100)")).manifest_fields()["nodes"] == ["a100-b"]
    assert m.submit(job("8(A100)")).manifest_fields()["nodes"] == ["a100-a"], "the 8-card node was kept free"
    naive = matcher(naive=True)
    naive.submit(job("1(A100)"))
    with pytest.raises(NoFit, match="not enough free cards"):
        naive.submit(job("8(A100)"))


def test_shares_pack_onto_partly_used_cards() -> None:
    m = matcher()
    first = m.submit(job("0.5"))
    second = m.submit(job("8G,0.5"))
    assert first.slots[0][:2] == second.slots[0][:2], "two halves on one card"
    assert first.flavor.name == "t4"


def test_memory_need_skips_small_cards_with_an_explanation() -> None:
    placement = matcher().place(Job("ft", parse("1"), 1, min_memory_gib=40))
    assert placement.flavor.name == "a100"
    assert placement.skipped["t4"] == "not enough memory: needs 40 GiB per card, this flavor gives 16 GiB"


def test_every_reason_when_nothing_fits() -> None:
    m = matcher()
    with pytest.raises(NoFit) as err:
        m.place(job("1(npu,910B)", framework="colossalai"))
    assert err.value.reasons == {
        "t4": "wrong vendor: the job wants huawei, this flavor is nvidia",
        "a100": "wrong vendor: the job wants huawei, this flavor is nvidia",
        "ascend": "framework unsupported: colossalai does not run on huawei",
        "cpu": "wrong vendor: the job wants huawei, this flavor is cpu"}
    m.submit(job("2", project="small"))
    with pytest.raises(NoFit) as quota:
        m.place(job("1", project="small"))
    assert quota.value.reasons["t4"] == "quota exhausted: project small uses 2 of 2 nvidia cards"
    with pytest.raises(NoFit) as full:
        m.place(job("4(A100)", workers=3))
    assert full.value.reasons["a100"].startswith("not enough free cards")


def test_release_gives_cards_and_quota_back() -> None:
    m = matcher()
    placements = [m.submit(job("2", project="small"))]
    m.release(placements[0])
    assert m.submit(job("2", project="small")).flavor.name == "t4"


def test_cpu_jobs_and_the_framework_matrix() -> None:
    assert matcher().place(job("0", framework="sklearn")).flavor.name == "cpu"
    assert frameworks.supports("mindspore", "huawei") and not frameworks.supports("mindspore", "nvidia")
    assert frameworks.image("pytorch", "huawei").endswith("pytorch-cann:0.1")
    with pytest.raises(InvalidInput, match="runs on huawei"):
        frameworks.image("mindspore", "nvidia")


def test_an_rdma_job_gets_the_flavors_rdma_resource_and_a_flavor_without_one_says_so() -> None:
    inventory = Inventory.from_dict({"flavors": [
        {"name": "plain", "vendor": "nvidia", "nodes": [{"name": "p1", "cards": 8}]},
        {"name": "fabric", "vendor": "nvidia", "rdma": "rdma/hca_shared_devices_a", "nodes": [{"name": "f1", "cards": 8}]}]})
    plain = Matcher(inventory).place(Job("r", parse("8"), 1))
    assert plain.flavor.name == "plain" and "rdma/hca_shared_devices_a" not in plain.pod().limits
    placed = Matcher(Inventory.from_dict({"flavors": [
        {"name": "plain", "vendor": "nvidia", "nodes": [{"name": "p1", "cards": 8}, {"name": "p2", "cards": 8}]},
        {"name": "fabric", "vendor": "nvidia", "rdma": "rdma/hca_shared_devices_a",
         "nodes": [{"name": "f1", "cards": 8}, {"name": "f2", "cards": 8}]}]})).place(Job("r", parse("8"), 2, rdma=True))
    assert placed.flavor.name == "fabric" and placed.skipped["plain"].startswith("no RDMA")
    assert placed.pod().limits == {"nvidia.com/gpu": "8", "rdma/hca_shared_devices_a": "1"}
