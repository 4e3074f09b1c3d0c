"""Placing jobs on accelerator pools: Kueue-style flavors, quotas, best-fit within a flavor.

An inventory (YAML) lists flavors (vendor, model, card memory, node labels, taints, sharing
mode, nodes with cards) and queues (an ordered list of flavors, per-project quotas). A job
goes to the first flavor in its queue's order with room; inside the flavor each worker goes
to the node (and, for shares, the card) that fits most tightly, which keeps whole nodes
free for large jobs. The result carries ``nodeSelector``, tolerations and resource limits;
when nothing fits, one reason per flavor says why.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml

from cascade.core.errors import InvalidInput
from cascade.scheduling import accelerators
from cascade.scheduling.accelerators import AcceleratorRequest


@dataclass
class Node:
    name: str
    free: list[float]  # free fraction of each card (1.0 = idle)
    cpu: float = 0.0  # free cores; with cpu_total 0 the node's CPU is not booked
    memory_gib: float = 0.0  # free host memory; with memory_total 0 it is not booked
    cpu_total: float = 0.0
    memory_total: float = 0.0

    @property
    def idle_cards(self) -> int:
        return sum(1 for f in self.free if f >= 1.0 - 1e-9)


@dataclass
class Flavor:
    name: str
    vendor: str
    model: str = ""
    memory_gib: float = 0.0
    node_labels: dict[str, str] = field(default_factory=dict)
    taints: list[dict[str, str]] = field(default_factory=list)
    sharing: str = "hami"  # hami | tencent | none
    rdma: str | None = None
    nodes: list[Node] = field(default_factory=list)
    nvlink: bool = False  # its cards are linked card to card (NVLink, Infinity Fabric, HCCS)
    network_gbps: float = 0.0  # how fast its nodes reach each other (0: not said)
    cluster: str = ""  # the cluster it is in ("": the platform's own backend)

    @cached_property
    def cards(self) -> int:
        """Cards in the flavor (its nodes are fixed when the inventory is read)."""
        return sum(len(n.free) for n in self.nodes)


@dataclass(frozen=True)
class Job:
    id: str
    request: AcceleratorRequest
    workers: int = 1
    framework: str = "pytorch"
    project: str = "default"
    queue: str = "default"
    min_memory_gib: float = 0.0  # e.g. from a fine-tuning memory estimate
    cpu: float = 0.0  # cores per worker
    memory_gib: float = 0.0  # host memory per worker
    rdma: bool = False  # an RDMA interface per worker (the flavor's rdma resource)

    # Worked out once per job (a waiting job is tried at many admission passes): only its own fields decide them.
    @cached_property
    def cards_needed(self) -> float:
        """The cards the job books in all, a share counted as its fraction (what quotas count)."""
        return self.workers * (self.request.count if self.request.share else self.request.cards)

    @cached_property
    def kind(self) -> tuple[object, ...]:
        """What, besides quotas and room, decides which flavors of its queue the job could ever use."""
        return (self.queue, self.request.raw, self.framework, self.rdma, self.min_memory_gib)

    @cached_property
    def shape(self) -> tuple[object, ...]:
        """What decides whether the job fits: two waiting jobs of one shape fit, or not, alike."""
        return (self.request.raw, self.workers, self.framework, self.project, self.queue, self.min_memory_gib,
                self.cpu, self.memory_gib, self.rdma)


@dataclass(frozen=True)
class PodPlacement:
    """Where a job's pods go, as a pod template needs it: the matcher's answer, typed.

    ``to_dict``/``from_dict`` use the Kubernetes field names (``nodeSelector``...), the shape it
    has in job records, in ``job.started`` events and in a local job's spec file.
    """

    image: str = ""
    flavor: str = ""
    nodes: tuple[str, ...] = ()
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: tuple[dict[str, str], ...] = ()
    limits: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # flavor -> why it was passed over
    memory_gib: float | None = None  # a fine-tune's estimated need per card
    cluster: str = ""  # the inventory's cluster it runs in ("": the platform's own backend)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"image": self.image, "flavor": self.flavor, "nodes": list(self.nodes),
                               "nodeSelector": dict(self.node_selector), "tolerations": [dict(t) for t in self.tolerations],
                               "limits": dict(self.limits), "skipped": dict(self.skipped)}
        if self.memory_gib is not None:
            out["memoryGiB"] = self.memory_gib
        if self.cluster:
            out["cluster"] = self.cluster
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PodPlacement:
        return cls(str(d.get("image", "")), str(d.get("flavor", "")), tuple(d.get("nodes") or ()),
                   dict(d.get("nodeSelector") or {}), tuple(dict(t) for t in d.get("tolerations") or ()),
                   {str(k): str(v) for k, v in (d.get("limits") or {}).items()}, dict(d.get("skipped") or {}),
                   None if d.get("memoryGiB") is None else float(d["memoryGiB"]), str(d.get("cluster", "")))


@dataclass
class Placement:
    job: Job
    flavor: Flavor
    slots: list[tuple[Node, list[int], float]]  # per worker: node, card indexes, share taken per card
    image: str
    skipped: dict[str, str]

    def pod(self) -> PodPlacement:
        """What a pod template needs: nodeSelector, tolerations, resource limits, image."""
        return PodPlacement.from_dict({**self.manifest_fields(), "skipped": self.skipped})

    def manifest_fields(self) -> dict[str, Any]:
        """``pod()`` as Kubernetes field names."""
        limits = accelerators.resources(self.job.request, self.flavor.vendor, sharing=self.flavor.sharing,
                                        card_memory_gib=self.flavor.memory_gib,
                                        rdma=self.flavor.rdma if self.job.rdma else None)
        tolerations = [{"key": t["key"], "operator": "Equal" if t.get("value") else "Exists",
                        **({"value": t["value"]} if t.get("value") else {}), "effect": t.get("effect", "NoSchedule")}
                       for t in self.flavor.taints]
        return {"nodeSelector": dict(self.flavor.node_labels), "tolerations": tolerations, "limits": limits,
                "image": self.image, "flavor": self.flavor.name, "nodes": [n.name for n, _, _ in self.slots],
                **({"cluster": self.flavor.cluster} if self.flavor.cluster else {})}


class NoFit(InvalidInput):
    """Nothing in the queue fits; ``reasons`` has one line per flavor."""

    def __init__(self, job: Job, reasons: dict[str, str]) -> None:
        text = "; ".join(f"{k}: {v}" for k, v in reasons.items()) or "the queue has no flavors"
        super().__init__(f"job {job.id} ({job.request.raw} x{job.workers}) fits nowhere: {text}",
                         field="resources.accelerator")
        self.reasons = reasons


@dataclass(frozen=True)
class Cluster:
    """Where some flavors are: a backend and how to reach it (a kubeconfig file and context, a namespace prefix)."""

    name: str
    backend: str = "kubernetes"
    kubeconfig: str = ""
    context: str = ""
    namespace_prefix: str = "cascade-"

    def __deepcopy__(self, memo: dict[int, object]) -> Cluster:
        return self  # immutable: copies of an inventory share it (and compiled, a frozen class cannot be rebuilt)


@dataclass
class Inventory:
    flavors: dict[str, Flavor]
    queues: dict[str, list[str]]
    quotas: dict[str, dict[str, float]]  # project -> vendor -> cards (its nominal quota)
    used: dict[tuple[str, str], float] = field(default_factory=dict)
    cohorts: dict[str, list[str]] = field(default_factory=dict)  # cohort -> projects that lend each other unused quota
    clusters: dict[str, Cluster] = field(default_factory=dict)
    cluster_quotas: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)  # cluster -> project -> vendor
    used_in: dict[tuple[str, str, str], float] = field(default_factory=dict)  # (project, cluster, vendor) -> cards

    def cohort(self, project: str) -> tuple[str, list[str]]:
        """The project's cohort and its members (("", []) when it has none)."""
        return next(((name, members) for name, members in self.cohorts.items() if project in members), ("", []))

    def borrowing(self, project: str, vendor: str) -> float:
        """How many cards of ``vendor`` the project uses beyond its nominal quota (borrowed from its cohort)."""
        quota = self.quotas.get(project, {}).get(vendor)
        return 0.0 if quota is None else max(0.0, self.used.get((project, vendor), 0.0) - quota)

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> Inventory:
        """Flavors at the top level run on the platform's own backend; ``clusters`` add flavors elsewhere, named
        ``<cluster>/<flavor>``, each cluster with its backend, credentials and, optionally, its own quotas."""
        flavors = {f["name"]: _flavor(f, "") for f in doc.get("flavors", [])}
        clusters, cluster_quotas = {}, {}
        for c in doc.get("clusters", []):
            name = str(c["name"])
            if c.get("backend", "kubernetes") not in ("kubernetes", "local"):
                raise InvalidInput(f"cluster {name}: backend must be kubernetes or local", field="clusters.backend")
            clusters[name] = Cluster(name, str(c.get("backend", "kubernetes")), str(c.get("kubeconfig", "")),
                                     str(c.get("context", "")), str(c.get("namespacePrefix", "cascade-")))
            for f in c.get("flavors", []):
                flavor = _flavor({**f, "name": f"{name}/{f['name']}"}, name)
                flavors[flavor.name] = flavor
            cluster_quotas[name] = {p: dict(v) for p, v in (c.get("quotas") or {}).items()}
        queues = {q["name"]: list(q["flavors"]) for q in doc.get("queues", [])} or {"default": list(flavors)}
        return cls(flavors, queues, {p: dict(v) for p, v in doc.get("quotas", {}).items()},
                   cohorts={str(k): [str(p) for p in v] for k, v in (doc.get("cohorts") or {}).items()},
                   clusters=clusters, cluster_quotas=cluster_quotas)

    @classmethod
    def load(cls, path: Path) -> Inventory:
        return cls.from_dict(yaml.safe_load(path.read_text()) or {})


def _flavor(f: dict[str, Any], cluster: str) -> Flavor:
    nodes = [_node(n["name"], int(n.get("cards", 0)), n) for n in f.get("nodes", [])]
    for i in range(int(f.get("count", 0))):  # shorthand: count nodes of cardsPerNode cards
        nodes.append(_node(f"{f['name'].rsplit('/', 1)[-1]}-{i}", int(f.get("cardsPerNode", 8)), f))
    vendor = accelerators.ALIASES.get(str(f.get("vendor", "nvidia")).lower())
    if vendor is None:
        raise InvalidInput(f"flavor {f.get('name')}: unknown vendor {f.get('vendor')!r}", field="vendor")
    return Flavor(f["name"], vendor, str(f.get("model", "")), float(f.get("memoryGiB", 0)),
                  dict(f.get("nodeLabels", {})), list(f.get("taints", [])), str(f.get("sharing", "hami")), f.get("rdma"),
                  nodes, bool(f.get("nvlink", False)), float(f.get("networkGbps", 0)), cluster)


def _node(name: str, cards: int, doc: dict[str, Any]) -> Node:
    cpu, memory = float(doc.get("cpu", 0)), float(doc.get("hostMemoryGiB", 0))
    return Node(name, [1.0] * cards, cpu, memory, cpu, memory)


_QUANTITY = re.compile(r"^(\d+(?:\.\d+)?)(m|k|M|G|T|Ki|Mi|Gi|Ti)?$")
_BYTES = {None: 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30,
          "Ti": 2**40}


def quantity(value: object, field: str = "resources") -> float:
    """A Kubernetes quantity as a plain number (``500m`` -> 0.5, ``1k`` -> 1000, ``2Gi`` -> 2147483648)."""
    match = _QUANTITY.match(str(value).strip())
    if not match:
        raise InvalidInput(f"{value!r} is not a Kubernetes quantity such as 2, 500m, 512Mi or 1k", field=field)
    return float(match.group(1)) * (0.001 if match.group(2) == "m" else _BYTES[match.group(2)])


def cpu_cores(value: object, field: str = "resources.cpu") -> float:
    """A Kubernetes CPU quantity (``2``, ``500m``) in cores."""
    match = _QUANTITY.match(str(value))
    if not match or match.group(2) not in (None, "m"):
        raise InvalidInput(f"cpu {value!r} is not a Kubernetes CPU quantity such as 2 or 500m", field=field)
    return quantity(value, field)


def memory_gib(value: object, field: str = "resources.memory") -> float:
    """A Kubernetes memory quantity (``512Mi``, ``2Gi``, ``1G``) in GiB."""
    match = _QUANTITY.match(str(value))
    if not match or match.group(2) == "m":
        raise InvalidInput(f"memory {value!r} is not a Kubernetes memory quantity such as 512Mi or 2Gi", field=field)
    return quantity(value, field) / 2**30
