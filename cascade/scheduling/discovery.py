"""What hardware there is: this machine's accelerators, cores, memory and RDMA devices, or a cluster's nodes.

``probe`` asks the vendors' own tools (``nvidia-smi``, ``rocm-smi``, ``npu-smi``, ``xpu-smi``),
falls back to the PCI devices in sysfs for cards whose tool is missing, and reads the cores,
``/proc/meminfo`` and ``/sys/class/infiniband``. ``from_nodes`` reads Kubernetes nodes (as the
API returns them): the device plugins' allocatable resources and the labels GPU feature discovery
and node-feature-discovery put on them (``nvidia.com/gpu.product``, ``nvidia.com/gpu.memory``,
``amd.com/gpu.product-name``...). Both give an inventory (``placement.Inventory``'s YAML form): a
flavor per kind of card, with its nodes, their cards, cores and host memory, taints, and the
RDMA resource where there is one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cascade.scheduling.placement import cpu_cores, memory_gib, quantity

Run = Callable[[list[str]], str]  # a command's standard output ("" when it failed)
PCI_VENDORS = {"0x10de": "nvidia", "0x1002": "amd", "0x19e5": "huawei", "0x1da3": "gaudi", "0xcabc": "cambricon",
               "0x1d94": "hygon", "0x1d22": "kunlun", "0x8086": "intel"}
ACCELERATOR_CLASSES = ("0x0300", "0x0302", "0x0380", "0x1200")  # display/3D controllers, processing accelerators
RESOURCES = {  # device plugin resource -> vendor (and a model where the resource names it)
    "nvidia.com/gpu": ("nvidia", ""), "amd.com/gpu": ("amd", ""), "gpu.intel.com/i915": ("intel", ""),
    "gpu.intel.com/xe": ("intel", ""), "habana.ai/gaudi": ("gaudi", "Gaudi"), "cambricon.com/mlu": ("cambricon", ""),
    "hygon.com/dcu": ("hygon", ""), "kunlunxin.com/xpu": ("kunlun", ""), "huawei.com/Ascend910": ("huawei", "910"),
    "huawei.com/Ascend310": ("huawei", "310"), "huawei.com/Ascend310P": ("huawei", "310P")}
MODEL_LABELS = ("nvidia.com/gpu.product", "amd.com/gpu.product-name", "feature.node.kubernetes.io/gpu.product",
                "accelerator", "cascade.io/accelerator", "node.kubernetes.io/accelerator")


def run_tool(command: list[str]) -> str:
    if not shutil.which(command[0]):
        return ""
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


@dataclass
class Cards:
    vendor: str
    model: str
    memory_gib: float
    count: int = 1
    source: str = ""


@dataclass
class Machine:
    """One machine as the probe saw it."""

    name: str
    cpu: int
    memory_gib: float
    cards: list[Cards] = field(default_factory=list)
    rdma: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _nvidia(out: str) -> list[Cards]:
    cards = []
    for line in out.strip().splitlines():
        name, _, mib = line.rpartition(",")
        if name.strip():
            cards.append(Cards("nvidia", _model("nvidia", name.strip()), round(float(mib or 0) / 1024, 1), 1, "nvidia-smi"))
    return cards


def _rocm(out: str) -> list[Cards]:
    try:
        doc = json.loads(out or "{}")
    except ValueError:
        return []
    cards = []
    for key, card in doc.items():
        if not str(key).startswith("card") or not isinstance(card, dict):
            continue
        model = str(card.get("Card Series") or card.get("Card series") or card.get("Card Model") or "").strip()
        total = card.get("VRAM Total Memory (B)") or 0
        cards.append(Cards("amd", model.replace("AMD Instinct ", "").split()[0] if model else "",
                           round(int(total) / 2**30, 1), 1, "rocm-smi"))
    return cards


def _npu(out: str) -> list[Cards]:
    ids = re.findall(r"NPU ID\s*:\s*(\d+)", out)
    names = re.findall(r"Chip Name\s*:\s*(?:Ascend\s*)?([0-9A-Za-z]+)", out)  # ``-l`` names boards, not chips
    model = names[0] if names else ""
    return [Cards("huawei", model, 0.0, 1, "npu-smi") for _ in ids]


def _xpu(out: str) -> list[Cards]:
    try:
        devices = json.loads(out or "{}").get("device_list") or []
    except (ValueError, AttributeError):
        return []
    return [Cards("intel", str(d.get("device_name", "")).replace("Intel(R) Data Center GPU ", "").split()[0]
                  if d.get("device_name") else "", round(int(d.get("memory_physical_size_byte") or 0) / 2**30, 1),
                  1, "xpu-smi") for d in devices if isinstance(d, dict)]


def _pci(sysfs: Path, known: set[str]) -> list[Cards]:
    """Accelerators on the PCI bus whose vendor's tool did not answer (model and memory unknown)."""
    cards = []
    for dev in sorted((sysfs / "bus" / "pci" / "devices").glob("*")):
        try:
            vendor = PCI_VENDORS.get((dev / "vendor").read_text().strip())
            klass = (dev / "class").read_text().strip()[:6]
        except OSError:
            continue
        if vendor and vendor not in known and klass in ACCELERATOR_CLASSES:
            if vendor == "intel" and klass == "0x0300":
                continue  # an integrated display, not a compute card
            cards.append(Cards(vendor, "", 0.0, 1, f"sysfs {dev.name}"))
    return cards


def _meminfo(proc: Path) -> float:
    try:
        match = re.search(r"MemTotal:\s+(\d+) kB", (proc / "meminfo").read_text())
    except OSError:
        return 0.0
    return round(int(match.group(1)) / 2**20, 1) if match else 0.0


def probe(run: Run = run_tool, sysfs: Path = Path("/sys"), proc: Path = Path("/proc"),
          name: str | None = None) -> Machine:
    """This machine: its accelerators (vendor tools first, sysfs for the rest), cores, memory and RDMA devices."""
    machine = Machine(name or socket.gethostname(), os.cpu_count() or 1, _meminfo(proc))
    found = _nvidia(run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"]))
    found += _rocm(run(["rocm-smi", "--showproductname", "--showmeminfo", "vram", "--json"]))
    found += _npu(run(["npu-smi", "info", "-l"]))
    found += _xpu(run(["xpu-smi", "discovery", "-j"]))
    found += _pci(sysfs, {c.vendor for c in found})
    machine.cards = found
    try:
        machine.rdma = sorted(p.name for p in (sysfs / "class" / "infiniband").iterdir())
    except OSError:
        machine.rdma = []
    if not found:
        machine.notes.append("no accelerator found (no vendor tool answered and no accelerator on the PCI bus): "
                             "jobs here run on the CPU")
    return machine


def _model(vendor: str, text: str) -> str:
    """A card's model as the matcher's requests name it (``NVIDIA-A100-SXM4-80GB`` -> ``A100``)."""
    if vendor != "nvidia":
        return text
    for prefix in ("NVIDIA-", "NVIDIA ", "Tesla-", "Tesla "):
        text = text.removeprefix(prefix)
    return re.split(r"[- ]", text)[0] if text else ""


def _flavor_name(vendor: str, model: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", f"{vendor}-{model}".lower()).strip("-") if model else vendor


def inventory(machines: Iterable[Machine], rdma_resource: str = "rdma/hca_shared_devices_a") -> dict[str, Any]:
    """The inventory YAML document for probed machines: a flavor per (vendor, model), and one for CPU jobs."""
    flavors: dict[str, dict[str, Any]] = {}
    for m in machines:
        node = {"name": m.name, "cpu": m.cpu, "hostMemoryGiB": m.memory_gib}
        kinds: dict[tuple[str, str, float], int] = {}
        for c in m.cards:
            kinds[(c.vendor, c.model, c.memory_gib)] = kinds.get((c.vendor, c.model, c.memory_gib), 0) + c.count
        for (vendor, model, mem), count in kinds.items():
            f = flavors.setdefault(_flavor_name(vendor, model), {
                "name": _flavor_name(vendor, model), "vendor": vendor, "model": model, "memoryGiB": mem, "nodes": []})
            if m.rdma:
                f["rdma"] = rdma_resource
            f["nodes"].append({**node, "cards": count})
        cpu = flavors.setdefault("cpu", {"name": "cpu", "vendor": "cpu", "nodes": []})
        cpu["nodes"].append({**node, "name": f"{m.name}-cpu" if kinds else m.name, "cards": 0})
    return {"flavors": sorted(flavors.values(), key=lambda f: (f["vendor"] == "cpu", f["name"]))}


def from_nodes(nodes: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The inventory of Kubernetes nodes (``V1Node`` as JSON): flavors from the device plugins' resources and the
    model labels, node selectors that pick them, their NoSchedule taints, each node's cards, cores and memory."""
    flavors: dict[str, dict[str, Any]] = {}
    for n in nodes:
        meta, spec, status = n.get("metadata") or {}, n.get("spec") or {}, n.get("status") or {}
        labels, allocatable = dict(meta.get("labels") or {}), dict(status.get("allocatable") or {})
        if spec.get("unschedulable"):
            continue
        node = {"name": meta.get("name", ""), "cpu": cpu_cores(allocatable.get("cpu", "0")),
                "hostMemoryGiB": round(memory_gib(allocatable.get("memory", "0")), 1)}
        taints = [{k: t[k] for k in ("key", "value", "effect") if t.get(k)} for t in spec.get("taints") or []
                  if t.get("effect") in ("NoSchedule", "NoExecute")  # node conditions' taints come and go: not the flavor's
                  and not str(t.get("key", "")).startswith(("node.kubernetes.io/", "node.cloudprovider.kubernetes.io/"))]
        rdma = next((r for r in allocatable if r.startswith("rdma/") and quantity(allocatable[r] or 0) > 0), None)
        placed = False
        for resource, (vendor, model_hint) in RESOURCES.items():
            count = int(quantity(allocatable.get(resource) or 0))
            if count <= 0:
                continue
            label = next((k for k in MODEL_LABELS if labels.get(k)), None)
            model = model_hint or (_model(vendor, labels[label]) if label else "")  # a resource that names it wins
            mem = float(labels.get("nvidia.com/gpu.memory", 0) or 0) / 1024  # MiB, from GPU feature discovery
            name = _flavor_name(vendor, model)
            f = flavors.setdefault(name, {"name": name, "vendor": vendor, "model": model, "memoryGiB": round(mem, 1),
                                          "nodeLabels": {label: labels[label]} if label else {},
                                          "taints": taints, "nodes": []})
            if rdma:
                f["rdma"] = rdma
            f["nodes"].append({**node, "cards": count})
            placed = True
        if not placed:
            flavors.setdefault("cpu", {"name": "cpu", "vendor": "cpu", "nodes": []})["nodes"].append({**node, "cards": 0})
    return {"flavors": sorted(flavors.values(), key=lambda f: (f["vendor"] == "cpu", f["name"]))}
