"""Discovery: the vendors' tools' own output, sysfs and /proc as files, Kubernetes nodes as the API returns them."""

from __future__ import annotations

import json
from pathlib import Path

from cascade.scheduling import discovery
from cascade.scheduling.accelerators import parse
from cascade.scheduling.matcher import Matcher
from cascade.scheduling.placement import Inventory, Job

NVIDIA_SMI = "NVIDIA A100-SXM4-80GB, 81920\n" * 8  # --query-gpu=name,memory.total --format=csv,noheader,nounits
ROCM_SMI = json.dumps({f"card{i}": {"Card Series": "AMD Instinct MI300X", "Card Model": "0x74a1",
                                    "VRAM Total Memory (B)": "206141652992"} for i in range(2)})
NPU_SMI = "\n".join(f"        NPU ID                         : {i}\n        Product Name                   : "
                    f"IT21HMDB02-B2\n        Chip Count                     : 1" for i in range(4))
XPU_SMI = json.dumps({"device_list": [{"device_id": 0, "device_name": "Intel(R) Data Center GPU Max 1550",
                                       "memory_physical_size_byte": 137438953472}]})


def machine_files(tmp_path: Path, pci: dict[str, tuple[str, str]] | None = None, rdma: tuple[str, ...] = ()) -> tuple[Path, Path]:
    sysfs, proc = tmp_path / "sys", tmp_path / "proc"
    proc.mkdir()
    (proc / "meminfo").write_text("MemTotal:       1056499708 kB\nMemFree:  1 kB\n")
    for name, (vendor, klass) in (pci or {}).items():
        dev = sysfs / "bus" / "pci" / "devices" / name
        dev.mkdir(parents=True)
        (dev / "vendor").write_text(vendor + "\n")
        (dev / "class").write_text(klass + "\n")
    for name in rdma:
        (sysfs / "class" / "infiniband" / name).mkdir(parents=True)
    return sysfs, proc


def tools(**outputs: str) -> discovery.Run:
    return lambda command: outputs.get(command[0].replace("-", "_"), "")


def test_an_eight_card_a100_machine_with_rdma_becomes_a_flavor_the_matcher_places_on(tmp_path: Path) -> None:
    sysfs, proc = machine_files(tmp_path, rdma=("mlx5_0", "mlx5_1"))
    m = discovery.probe(tools(nvidia_smi=NVIDIA_SMI), sysfs, proc, name="gpu-1")
    assert [(c.vendor, c.model, c.memory_gib) for c in m.cards] == [("nvidia", "A100", 80.0)] * 8
    assert m.rdma == ["mlx5_0", "mlx5_1"] and m.memory_gib == 1007.6 and not m.notes
    doc = discovery.inventory([m])
    a100 = doc["flavors"][0]
    assert (a100["name"], a100["model"], a100["memoryGiB"], a100["rdma"]) == ("nvidia-a100", "A100", 80.0,
                                                                               "rdma/hca_shared_devices_a")
    assert a100["nodes"] == [{"name": "gpu-1", "cpu": m.cpu, "hostMemoryGiB": 1007.6, "cards": 8}]
    placed = Matcher(Inventory.from_dict(doc)).place(Job("j", parse("8(A100)"), 1, rdma=True, cpu=1, memory_gib=64))
    assert placed.flavor.name == "nvidia-a100" and placed.pod().limits["rdma/hca_shared_devices_a"] == "1"


def test_amd_ascend_and_intel_tools_and_cards_only_sysfs_sees(tmp_path: Path) -> None:
    sysfs, proc = machine_files(tmp_path, pci={"0000:3b:00.0": ("0xcabc", "0x120000"),
                                               "0000:00:02.0": ("0x8086", "0x030000")})  # an MLU, an integrated display
    m = discovery.probe(tools(rocm_smi=ROCM_SMI, npu_smi=NPU_SMI, xpu_smi=XPU_SMI), sysfs, proc, name="mixed")
    kinds = sorted({(c.vendor, c.model, c.memory_gib, c.source.split()[0]) for c in m.cards})
    assert kinds == [("amd", "MI300X", 192.0, "rocm-smi"), ("cambricon", "", 0.0, "sysfs"),
                     ("huawei", "", 0.0, "npu-smi"), ("intel", "Max", 128.0, "xpu-smi")]
    assert sum(c.vendor == "huawei" for c in m.cards) == 4 and sum(c.vendor == "amd" for c in m.cards) == 2
    names = [f["name"] for f in discovery.inventory([m])["flavors"]]
    assert names == ["amd-mi300x", "cambricon", "huawei", "intel-max", "cpu"]


def test_a_machine_without_accelerators_says_so(tmp_path: Path) -> None:
    sysfs, proc = machine_files(tmp_path, pci={"0000:00:02.0": ("0x8086", "0x030000")})
    m = discovery.probe(tools(), sysfs, proc, name="laptop")
    assert m.cards == [] and "no accelerator found" in m.notes[0]
    assert discovery.inventory([m]) == {"flavors": [{"name": "cpu", "vendor": "cpu", "nodes": [
        {"name": "laptop", "cpu": m.cpu, "hostMemoryGiB": 1007.6, "cards": 0}]}]}
