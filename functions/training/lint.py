"""The resource checklist, as a lint at submission: what makes a training job slow on the hardware it gets.

Each rule names what it saw and why it matters. The flavor is the one the matcher would choose on
the empty inventory (card memory, NVLink, network speed); a job that fits nowhere is linted on
its spec alone (the launcher then says why it fits nowhere). A project's findings are warnings
(in the submission's answer and the job's record) unless the project asks for refusals
(``cascade projects lint NAME --refuse``): then they are a 400 naming each one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cascade.core.errors import InvalidInput
from cascade.scheduling.accelerators import parse
from cascade.scheduling.matcher import Matcher
from cascade.scheduling.placement import Flavor, Inventory, Job, NoFit, cpu_cores, memory_gib
from cascade.stores import StateStore

MIN_CORES = 8
MIN_NETWORK_GBPS = 10.0
MIN_VISION_CARD_GIB = 16.0


@dataclass(frozen=True)
class Finding:
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.rule}: {self.message}"


def lint(spec: Mapping[str, Any], flavor: Flavor | None) -> list[Finding]:
    """The checklist's findings for a training job's spec on ``flavor`` (None: the spec alone)."""
    request = parse(str((spec.get("resources") or {}).get("accelerator", "0")))
    if request.none or (flavor is not None and flavor.vendor == "cpu"):
        return []  # the checklist is about feeding accelerators
    resources = spec.get("resources") or {}
    workers, cards = int(spec.get("workers", 1)), request.cards
    out = []
    cores = cpu_cores(resources.get("cpu", "1"))
    if cores < MIN_CORES:
        out.append(Finding("cpu-cores", f"{cores:g} CPU cores per worker feed {request.raw} accelerator card(s); below "
                                        f"{MIN_CORES} cores the data loaders and the framework's host threads starve "
                                        "the cards (set resources.cpu)"))
    card_gib = request.memory_gib or (flavor.memory_gib * (request.count if request.share else 1) if flavor else 0.0)
    host = memory_gib(resources.get("memory", "2Gi"))
    accelerator_gib = card_gib * (1 if request.share else cards)
    if accelerator_gib and host < 2 * accelerator_gib:
        out.append(Finding("host-memory", f"{host:g} GiB of host memory per worker is below twice its {accelerator_gib:g} "
                                          "GiB of accelerator memory; checkpoints, pinned buffers and the input "
                                          "pipeline need at least 2x (set resources.memory)"))
    if cards >= 8 and flavor is not None and not flavor.nvlink:
        out.append(Finding("nvlink", f"{cards} cards in one worker on flavor {flavor.name}, which has no NVLink (or "
                                     "equivalent card-to-card link): all-reduce crosses PCIe, several times slower"))
    if workers > 1:
        if not resources.get("rdma"):
            out.append(Finding("rdma", f"{workers} workers exchange gradients between nodes without RDMA; ask for it "
                                       "(resources.rdma: true) on a flavor that has it"))
        if flavor is not None and flavor.network_gbps and flavor.network_gbps < MIN_NETWORK_GBPS:
            out.append(Finding("network", f"{workers} workers on flavor {flavor.name}, whose nodes are linked at "
                                          f"{flavor.network_gbps:g} Gbit/s, below {MIN_NETWORK_GBPS:g} Gbit/s"))
    if spec.get("task") == "vision" and card_gib and card_gib < MIN_VISION_CARD_GIB:
        out.append(Finding("vision-memory", f"a computer-vision job on {card_gib:g} GiB cards, under "
                                            f"{MIN_VISION_CARD_GIB:g} GiB: batch sizes and image resolutions get cut"))
    return out


class Linter:
    """The lint as the gateway runs it: the flavor from the inventory, the mode from the project's record."""

    def __init__(self, inventory: Inventory, store: StateStore, queue: str = "default") -> None:
        self.matcher, self.store, self.queue = Matcher(inventory), store, queue

    def flavor(self, spec: Mapping[str, Any], project: str) -> Flavor | None:
        request = parse(str((spec.get("resources") or {}).get("accelerator", "0")))
        try:
            return self.matcher.place(Job("lint", request, int(spec.get("workers", 1)), str(spec.get("framework", "")),
                                          project, self.queue)).flavor
        except NoFit:
            return None

    def check(self, kind: str, spec: Mapping[str, Any], project: str) -> list[str]:
        """The warnings for a submission; InvalidInput listing them when the project refuses on findings."""
        if kind != "training":
            return []
        findings = [str(f) for f in lint(spec, self.flavor(spec, project))]
        record = self.store.get_record("project", project) or {}
        if findings and record.get("lint") == "refuse":
            raise InvalidInput(f"project {project} refuses jobs the resource checklist flags: " + "; ".join(findings),
                               field="/spec/resources")
        return findings
