"""Accelerator requests (cube-studio's strings) and the vendors' Kubernetes resource names.

Accepted forms: ``0`` (no accelerator), ``2`` (two whole cards of the default vendor),
``1(V100)`` (a model: also the node selector ``gpu-type=V100``), ``1(npu,910B)`` (vendor and
model), ``0.5`` (a share of one card), ``8G,0.5`` (card memory plus a share), ``1(mig-1g.10gb)``
(an NVIDIA MIG profile). Resource names follow design.md section 6.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import cached_property, lru_cache

from cascade.core.errors import InvalidInput

FORMS = "0 | 2 | 1(V100) | 1(npu,910B) | 0.5 | 8G,0.5 | 1(mig-1g.10gb)"
VENDORS = ("nvidia", "huawei", "amd", "intel", "gaudi", "cambricon", "hygon", "kunlun", "cpu")
ALIASES = {"gpu": "nvidia", "nvidia": "nvidia", "cuda": "nvidia", "npu": "huawei", "ascend": "huawei",
           "huawei": "huawei", "amd": "amd", "rocm": "amd", "intel": "intel", "xe": "intel", "gaudi": "gaudi",
           "habana": "gaudi", "hpu": "gaudi", "mlu": "cambricon", "cambricon": "cambricon", "dcu": "hygon",
           "hygon": "hygon", "xpu": "kunlun", "kunlun": "kunlun", "cpu": "cpu"}
MODEL_VENDOR = {"v100": "nvidia", "a100": "nvidia", "h100": "nvidia", "h200": "nvidia", "l4": "nvidia", "t4": "nvidia",
                "a10": "nvidia", "l40s": "nvidia", "910": "huawei", "910b": "huawei", "310": "huawei",
                "310p": "huawei", "mi250": "amd", "mi300x": "amd", "max1550": "intel", "gaudi2": "gaudi",
                "gaudi3": "gaudi", "mlu370": "cambricon", "mlu590": "cambricon", "z100": "hygon", "k100": "hygon",
                "p800": "kunlun", "r200": "kunlun"}
WHOLE = {"nvidia": "nvidia.com/gpu", "amd": "amd.com/gpu", "intel": "gpu.intel.com/i915", "gaudi": "habana.ai/gaudi",
         "cambricon": "cambricon.com/mlu", "hygon": "hygon.com/dcu", "kunlun": "kunlunxin.com/xpu"}
_PATTERN = re.compile(r"^(?:(?P<mem>\d+(?:\.\d+)?)G,)?(?P<count>\d+(?:\.\d+)?)(?:\((?P<inner>[^()]*)\))?$", re.I)


@dataclass(frozen=True)
class AcceleratorRequest:
    count: float  # whole cards when >= 1, a share of one card when < 1, 0 for none
    vendor: str | None = None  # None: the default vendor of the pool
    model: str | None = None
    memory_gib: float | None = None
    mig: str | None = None  # MIG profile such as 1g.10gb
    raw: str = "0"

    @cached_property
    def none(self) -> bool:
        return self.count == 0

    @cached_property
    def share(self) -> bool:
        return 0 < self.count < 1

    @cached_property
    def cards(self) -> int:
        """Whole cards taken from a node (a share still sits on one card)."""
        return 0 if self.none else max(1, math.ceil(self.count - 1e-9))


def parse(text: str | int | float) -> AcceleratorRequest:
    """Parse a request string; InvalidInput lists the accepted forms. Requests are immutable, so one text gives one
    shared object (its derived properties are worked out once, not once per job)."""
    return _parse(str(text).strip().replace(" ", ""), str(text))


@lru_cache(maxsize=4096)
def _parse(raw: str, text: str) -> AcceleratorRequest:
    match = _PATTERN.match(raw)
    bad = InvalidInput(f"accelerator request {text!r} is not one of: {FORMS}", field="resources.accelerator")
    if not match:
        raise bad
    count = float(match["count"])
    memory = float(match["mem"]) if match["mem"] else None
    if count > 1 and count != int(count) or count > 64 or (memory is not None and not 0 < count <= 1):
        raise bad
    vendor = model = mig = None
    for part in filter(None, (match["inner"] or "").split(",")):
        low = part.lower()
        if low.startswith("mig-"):
            vendor, mig = "nvidia", low[4:]
        elif low in ALIASES and vendor is None and model is None:
            vendor = ALIASES[low]
        elif model is None:
            model = part.upper() if low in MODEL_VENDOR else part
            vendor = vendor or MODEL_VENDOR.get(low)
        else:
            raise bad
    if count == 0 and (vendor or model or memory):
        raise bad
    if mig and count != int(count):
        raise bad
    return AcceleratorRequest(count, vendor, model, memory, mig, raw)


def ascend_resource(model: str | None) -> str:
    m = (model or "910").upper()
    return "huawei.com/Ascend310P" if m.startswith("310P") else (
        "huawei.com/Ascend310" if m.startswith("310") else "huawei.com/Ascend910")


def resources(request: AcceleratorRequest, vendor: str, *, sharing: str = "hami", card_memory_gib: float = 0,
              rdma: str | None = None) -> dict[str, str]:
    """Kubernetes resource limits for one worker on a card of ``vendor``."""
    if request.none or vendor == "cpu":
        return {}
    out: dict[str, str] = {}
    if vendor == "nvidia" and request.mig:
        out[f"nvidia.com/mig-{request.mig}"] = str(int(request.count))
    elif vendor == "nvidia" and request.share:
        memory_mib = int((request.memory_gib or request.count * card_memory_gib) * 1024)
        if sharing == "tencent":
            out["tencent.com/vcuda-core"] = str(round(request.count * 100))
            out["tencent.com/vcuda-memory"] = str(max(1, memory_mib // 256))  # units of 256 MiB
        else:  # HAMi
            out.update({"nvidia.com/gpu": "1", "nvidia.com/gpucores": str(round(request.count * 100))})
            if memory_mib:
                out["nvidia.com/gpumem"] = str(memory_mib)
    elif vendor == "huawei":
        out[ascend_resource(request.model)] = str(request.cards)
    elif vendor == "intel":  # the Intel GPU device plugin names its resource after the kernel driver
        out["gpu.intel.com/xe" if sharing == "xe" else "gpu.intel.com/i915"] = str(request.cards)
    else:
        out[WHOLE[vendor]] = str(request.cards)
    if rdma:
        out[rdma] = "1"
    return out
